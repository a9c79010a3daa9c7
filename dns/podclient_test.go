package dns

import (
	"fmt"
	"net/http"
	"net/netip"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/netplane/netplane/e2e/framework"
)

// noWatchList is a client that says it cannot watch-list: the pods are
// then listed in pages.
type noWatchList struct{ kubernetes.Interface }

func (noWatchList) IsWatchListSemanticsUnSupported() bool { return true }

// podRequests records the role's requests for pods.
type podRequests struct {
	next http.RoundTripper
	mu   sync.Mutex
	reqs []*http.Request
}

func (p *podRequests) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Path == "/api/v1/pods" {
		p.mu.Lock()
		p.reqs = append(p.reqs, r)
		p.mu.Unlock()
	}
	return p.next.RoundTrip(r)
}

// TestPodsReadAsProtobufFollowARealAPIServer runs the role against a real
// API server with 600 pods, reading them through the wire reader by
// watch-list and by pages of 500: every running pod's address is indexed
// and a finished one's is not; then a pod deleted, one finished and one
// created are followed.
func TestPodsReadAsProtobufFollowARealAPIServer(t *testing.T) {
	api := framework.SharedAPIServer(t, framework.Options{})
	ctx := framework.Ctx(t)
	const ns, n = "wire-reader", 600
	if _, err := api.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	addr := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 251, byte(i >> 8), byte(i)}) }
	pod := func(i int, phase corev1.PodPhase) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("p-%04d", i)},
			Status: corev1.PodStatus{Phase: phase, PodIPs: []corev1.PodIP{{IP: addr(i).String()}}}}
	}
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < n; i += 8 {
				phase := corev1.PodRunning
				if i == n-1 {
					phase = corev1.PodSucceeded
				}
				errs <- createPod(ctx, api.Client, pod(i, phase))
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	// running are the pods that hold their addresses; each subtest
	// deletes one, finishes one and creates one.
	running := map[int]bool{}
	for i := range n - 1 {
		running[i] = true
	}
	next := n
	for _, tc := range []struct {
		name      string
		watchList bool
	}{{"watch-list", true}, {"paged list", false}} {
		t.Run(tc.name, func(t *testing.T) {
			rt := &podRequests{}
			cfg := rest.CopyConfig(api.RestConfig)
			cfg.Wrap(func(next http.RoundTripper) http.RoundTripper { rt.next = next; return rt })
			var client kubernetes.Interface = kubernetes.NewForConfigOrDie(cfg)
			if !tc.watchList {
				client = noWatchList{client}
			}
			c := dnsConfig(t, "127.0.0.1:1")
			c.PodRecords = podsVerified
			s, _ := startServer(t, c, client, true)
			indexed := func(i int) bool {
				got, ok := s.Handler.Index().podNamespace(addr(i))
				return ok && got == ns
			}
			for i := range next {
				if indexed(i) != running[i] {
					t.Fatalf("%s (pod %d) indexed: %v, want %v", addr(i), i, indexed(i), running[i])
				}
			}

			gone, done, born := 2*(next-n), 2*(next-n)+1, next
			next++
			running[gone], running[done], running[born] = false, false, true
			if err := api.Client.CoreV1().Pods(ns).Delete(ctx, pod(gone, "").Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			p, err := api.Client.CoreV1().Pods(ns).Get(ctx, pod(done, "").Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			p.Status.Phase = corev1.PodSucceeded
			if _, err := api.Client.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			if err := createPod(ctx, api.Client, pod(born, corev1.PodRunning)); err != nil {
				t.Fatal(err)
			}
			framework.EventuallyEvery(t, 5*time.Millisecond, 10*time.Second, "the changes to be followed", func() error {
				if indexed(gone) || indexed(done) || !indexed(born) {
					return fmt.Errorf("deleted %v, finished %v, created %v indexed; want false, false, true", indexed(gone), indexed(done), indexed(born))
				}
				return nil
			})

			rt.mu.Lock()
			defer rt.mu.Unlock()
			var lists, watchLists int
			for _, r := range rt.reqs {
				// The wire reader's client takes protobuf alone; client-go's
				// typed one would take JSON too.
				if a := r.Header.Get("Accept"); a != "application/vnd.kubernetes.protobuf" {
					t.Errorf("%s asked for %q, want protobuf alone (the wire reader's client)", r.URL, a)
				}
				q := r.URL.Query()
				switch {
				case q.Get("watch") == "true" && q.Get("sendInitialEvents") == "true":
					watchLists++
				case q.Get("watch") != "true":
					lists++
				}
			}
			if tc.watchList && (watchLists != 1 || lists != 0) {
				t.Errorf("%d watch-lists and %d lists, want one watch-list", watchLists, lists)
			}
			if !tc.watchList && (watchLists != 0 || lists < 2) {
				t.Errorf("%d watch-lists and %d lists, want pages of 500", watchLists, lists)
			}
		})
	}
}
