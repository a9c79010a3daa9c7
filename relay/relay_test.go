package relay

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// apiPod is a pod as the API server would give the relay.
func apiPod(name string, rv int, ip string, labels map[string]string) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, ResourceVersion: fmt.Sprint(rv), Labels: labels, UID: types.UID("u-" + name)},
		Spec: v1.PodSpec{NodeName: "n1", Containers: []v1.Container{{Name: "c", Image: "img",
			Ports: []v1.ContainerPort{{Name: "http", ContainerPort: 8080}, {ContainerPort: 9090}}}}},
		Status: v1.PodStatus{Phase: v1.PodRunning, PodIP: ip, PodIPs: []v1.PodIP{{IP: ip}},
			Conditions: []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionTrue}}},
	}
}

// feed hands the store what the relay's reflector would: digests.
func add(s *Store, p *v1.Pod)    { _ = s.Add(Digest(p)) }
func update(s *Store, p *v1.Pod) { _ = s.Update(Digest(p)) }

func relist(s *Store, rv int, pods ...*v1.Pod) {
	var list []any
	for _, p := range pods {
		list = append(list, Digest(p))
	}
	_ = s.Replace(list, fmt.Sprint(rv))
}

// rig is a relay served over TLS, read by a client-go informer as a node
// role reads it, counting the relay's lists and the informer's changes.
type rig struct {
	store   *Store
	srv     *httptest.Server
	client  kubernetes.Interface
	lists   atomic.Int64
	updates atomic.Int64
	changed chan string
	inf     cache.SharedIndexInformer
}

func newRig(t *testing.T, s *Store) *rig {
	t.Helper()
	r := &rig{store: s, changed: make(chan string, 10_000)}
	inner := &Server{Store: s, Bookmarks: 20 * time.Millisecond}
	r.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Query().Get("watch") == "" {
			r.lists.Add(1)
		}
		inner.ServeHTTP(w, req)
	}))
	t.Cleanup(r.srv.Close)
	cfg := &rest.Config{Host: r.srv.URL, TLSClientConfig: rest.TLSClientConfig{Insecure: true},
		ContentConfig: rest.ContentConfig{ContentType: protobufType, AcceptContentTypes: protobufType}}
	var err error
	if r.client, err = kubernetes.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	return r
}

type listedOnly struct{ kubernetes.Interface }

func (listedOnly) IsWatchListSemanticsUnSupported() bool { return true }

// read starts the informer and waits for its first list.
func (r *rig) read(t *testing.T) {
	t.Helper()
	pods := r.client.CoreV1().Pods("")
	lw := cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc:  func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return pods.List(ctx, o) },
		WatchFuncWithContext: pods.Watch,
	}, listedOnly{r.client})
	r.inf = cache.NewSharedIndexInformer(lw, &v1.Pod{}, 0, cache.Indexers{})
	note := func(obj any) {
		if p, ok := obj.(*v1.Pod); ok {
			r.changed <- p.Name
		} else if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			r.changed <- d.Key
		}
	}
	_, _ = r.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    note,
		UpdateFunc: func(_, cur any) { r.updates.Add(1); note(cur) },
		DeleteFunc: note,
	})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go r.inf.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), r.inf.HasSynced) {
		t.Fatal("never synced")
	}
	for len(r.changed) > 0 { // the list's own additions
		<-r.changed
	}
}

// await waits until the informer was handed a change of each of names,
// in any order.
func (r *rig) await(t *testing.T, names ...string) {
	t.Helper()
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	deadline := time.After(10 * time.Second)
	for len(want) > 0 {
		select {
		case got := <-r.changed:
			delete(want, got)
		case <-deadline:
			t.Fatalf("no change of %v reached the reader", want)
		}
	}
}

func (r *rig) get(name string) *v1.Pod {
	o, ok, _ := r.inf.GetStore().GetByKey("ns/" + name)
	if !ok {
		return nil
	}
	return o.(*v1.Pod)
}

func TestAReaderEndsWithTheRelaysPodsPageByPage(t *testing.T) {
	s := NewStore()
	var pods []*v1.Pod
	for i := range 1234 {
		pods = append(pods, apiPod(fmt.Sprintf("p%04d", i), 10+i, fmt.Sprintf("10.1.%d.%d", i/250, i%250+1), map[string]string{"app": "a"}))
	}
	relist(s, 5000, pods...)
	r := newRig(t, s)
	r.read(t)
	if n := len(r.inf.GetStore().List()); n != 1234 {
		t.Fatalf("the reader has %d pods, want 1234", n)
	}
	// The reflector lists 500 at a time: three pages.
	if n := r.lists.Load(); n != 3 {
		t.Errorf("%d list requests, want 3 pages", n)
	}
	p := r.get("p0007")
	if p == nil || p.Status.PodIP != "10.1.0.8" || p.Labels["app"] != "a" || len(p.Spec.Containers) != 1 ||
		len(p.Spec.Containers[0].Ports) != 1 || p.Spec.Containers[0].Ports[0].Name != "http" || len(p.Status.Conditions) != 0 {
		t.Errorf("p0007 read as %+v: want its digest (address, labels, the named port only, no conditions)", p)
	}
}

func TestOnlyChangesOfTheDigestReachTheReader(t *testing.T) {
	s := NewStore()
	relist(s, 100, apiPod("a", 1, "10.0.0.1", nil), apiPod("b", 2, "10.0.0.2", nil))
	r := newRig(t, s)
	r.read(t)

	// A status update the digest does not see (readiness), then one it does.
	notReady := apiPod("a", 101, "10.0.0.1", nil)
	notReady.Status.Conditions[0].Status = v1.ConditionFalse
	update(s, notReady)
	update(s, apiPod("b", 102, "10.0.0.2", map[string]string{"role": "db"}))
	r.await(t, "b")
	if got := r.get("b").Labels["role"]; got != "db" {
		t.Fatalf("b's labels %q", got)
	}
	if n := r.updates.Load(); n != 1 {
		t.Errorf("the reader saw %d updates, want 1: a status change no node reads was sent", n)
	}
	add(s, apiPod("c", 103, "10.0.0.3", nil))
	r.await(t, "c")
	_ = s.Delete(Digest(apiPod("a", 104, "10.0.0.1", nil)))
	r.await(t, "a")
	if r.get("a") != nil {
		t.Error("a is still read after its deletion")
	}
}

func TestARelistBecomesChangesNotAListOfTheReaders(t *testing.T) {
	s := NewStore()
	relist(s, 100, apiPod("a", 1, "10.0.0.1", nil), apiPod("b", 2, "10.0.0.2", nil), apiPod("c", 3, "10.0.0.3", nil))
	r := newRig(t, s)
	r.read(t)
	lists := r.lists.Load()
	// After an API server outage the relay lists: b changed, c is gone, d
	// is new, a is as it was.
	relist(s, 200, apiPod("a", 1, "10.0.0.1", nil), apiPod("b", 150, "10.0.0.9", nil), apiPod("d", 160, "10.0.0.4", nil))
	r.await(t, "b", "c", "d")
	if r.get("b").Status.PodIP != "10.0.0.9" || r.get("c") != nil || r.get("d") == nil || r.get("a") == nil {
		t.Fatalf("after the relay's relist the reader has b=%v c=%v d=%v a=%v", r.get("b"), r.get("c"), r.get("d"), r.get("a"))
	}
	if r.lists.Load() != lists {
		t.Errorf("the reader listed again: a relay's relist must reach it as changes")
	}
	if n := r.updates.Load(); n != 1 {
		t.Errorf("%d updates, want 1 (a was unchanged)", n)
	}
}

func TestAReaderResumesFromItsVersionAfterItsWatchBroke(t *testing.T) {
	s := NewStore()
	relist(s, 100, apiPod("a", 1, "10.0.0.1", nil))
	r := newRig(t, s)
	r.read(t)
	// A watch that ends having carried nothing is "very short" to
	// client-go, which then lists again whatever the server.
	add(s, apiPod("b", 101, "10.0.0.2", nil))
	r.await(t, "b")
	lists := r.lists.Load()
	r.srv.CloseClientConnections()
	add(s, apiPod("c", 102, "10.0.0.3", nil))
	r.await(t, "c")
	if r.lists.Load() != lists {
		t.Errorf("the reader listed again after a broken watch: it must resume from its version")
	}
}

func TestAWatchFromAVersionTheRelayNoLongerKeepsIsTooOld(t *testing.T) {
	s := NewStore()
	s.maxLog = 2
	relist(s, 100, apiPod("a", 1, "10.0.0.1", nil))
	for i := range 5 {
		add(s, apiPod(fmt.Sprint("n", i), 101+i, "10.0.1.1", nil))
	}
	r := newRig(t, s)
	for _, tc := range []struct {
		from string
		gone bool
	}{
		{"100", true},  // three changes after it are no longer kept
		{"103", false}, // 104 and 105 are
		{"105", false}, // nothing after it yet
	} {
		w, err := r.client.CoreV1().Pods("").Watch(context.Background(), metav1.ListOptions{ResourceVersion: tc.from})
		if err != nil {
			t.Fatal(err)
		}
		var first watch.Event
		select {
		case first = <-w.ResultChan():
		case <-time.After(300 * time.Millisecond):
		}
		w.Stop()
		isGone := first.Type == watch.Error && apierrors.IsResourceExpired(apierrors.FromObject(first.Object))
		if isGone != tc.gone {
			t.Errorf("watch from %s: first event %v %v, want too old: %v", tc.from, first.Type, first.Object, tc.gone)
		}
	}
}

func TestALargePageGoesCompressedToAReaderThatTakesGzip(t *testing.T) {
	s := NewStore()
	var pods []*v1.Pod
	for i := range 3000 {
		pods = append(pods, apiPod(fmt.Sprintf("p%04d", i), 10+i, fmt.Sprintf("10.2.%d.%d", i/250, i%250+1), map[string]string{"app": "a"}))
	}
	relist(s, 5000, pods...)
	for _, tc := range []struct {
		accept, limit string
		gzip          bool
	}{
		{"gzip", "0", true},
		{"", "0", false},
		{"gzip", "10", false}, // a small page is not worth it
	} {
		req := httptest.NewRequest(http.MethodGet, Path+"?limit="+tc.limit, nil)
		req.Header.Set("Accept-Encoding", tc.accept)
		rec := httptest.NewRecorder()
		(&Server{Store: s}).ServeHTTP(rec, req)
		body := rec.Body.Bytes()
		if got := rec.Header().Get("Content-Encoding") == "gzip"; got != tc.gzip {
			t.Fatalf("accept %q, limit %s: compressed %v, want %v", tc.accept, tc.limit, got, tc.gzip)
		}
		if tc.gzip {
			zr, err := gzip.NewReader(bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			if body, err = io.ReadAll(zr); err != nil {
				t.Fatal(err)
			}
		}
		if !bytes.Equal(body, listBody(mustPage(s, tc.limit))) {
			t.Errorf("accept %q, limit %s: the body is not the page", tc.accept, tc.limit)
		}
	}
}

func mustPage(s *Store, limit string) ([][]byte, uint64, string) {
	n, _ := strconv.Atoi(limit)
	items, rv, next := s.Page("", n)
	if next != "" {
		next = writeContinue(rv, next)
	}
	return items, rv, next
}

func TestPagesFollowAddsDeletionsAndRelists(t *testing.T) {
	s := NewStore()
	relist(s, 10, apiPod("c", 1, "10.0.0.3", nil), apiPod("a", 2, "10.0.0.1", nil), apiPod("e", 3, "10.0.0.5", nil))
	names := func() []string {
		var out []string
		after := ""
		for {
			items, _, next := s.Page(after, 2)
			for _, it := range items {
				p := &v1.Pod{}
				if err := p.Unmarshal(it); err != nil {
					t.Fatal(err)
				}
				out = append(out, p.Name)
			}
			if next == "" {
				return out
			}
			after = next
		}
	}
	steps := []struct {
		name string
		do   func()
		want string
	}{
		{"listed", func() {}, "a c e"},
		{"added", func() { add(s, apiPod("b", 11, "10.0.0.2", nil)); add(s, apiPod("f", 12, "10.0.0.6", nil)) }, "a b c e f"},
		{"deleted", func() { _ = s.Delete(Digest(apiPod("c", 13, "", nil))) }, "a b e f"},
		{"relisted without a and f, with d", func() {
			relist(s, 20, apiPod("b", 11, "10.0.0.2", nil), apiPod("d", 14, "10.0.0.4", nil), apiPod("e", 3, "10.0.0.5", nil))
		}, "b d e"},
	}
	for _, st := range steps {
		st.do()
		if got := strings.Join(names(), " "); got != st.want {
			t.Errorf("%s: pages name %q, want %q", st.name, got, st.want)
		}
	}
}
