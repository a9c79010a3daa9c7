package endpointslice

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/netplane/netplane/controllers/internal/kit"
	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/internal/informer"
)

// The integration tests share one etcd + kube-apiserver (started on first
// use) and give each test its own namespace; no garbage collector or
// kubelet runs, so the tests set pod status themselves.
func TestMain(m *testing.M) { framework.RunShared(m) }

// writeCounter counts EndpointSlice writes per namespace and verb as they
// leave a client, whether or not the API server accepts them.
type writeCounter struct {
	mu     sync.Mutex
	counts map[string]*[3]int // namespace → creates, updates, deletes
}

func (w *writeCounter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		ns, ok := sliceNamespace(r.URL.Path)
		verb := map[string]int{http.MethodPost: 0, http.MethodPut: 1, http.MethodPatch: 1, http.MethodDelete: 2}
		if i, write := verb[r.Method]; ok && write {
			w.mu.Lock()
			if w.counts[ns] == nil {
				w.counts[ns] = &[3]int{}
			}
			w.counts[ns][i]++
			w.mu.Unlock()
		}
		return rt.RoundTrip(r)
	})
}

func (w *writeCounter) get(ns string) [3]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if c := w.counts[ns]; c != nil {
		return *c
	}
	return [3]int{}
}

func (w *writeCounter) total() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, c := range w.counts {
		n += c[0] + c[1] + c[2]
	}
	return n
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// sliceNamespace parses /apis/discovery.k8s.io/v1/namespaces/NS/endpointslices[/name].
func sliceNamespace(path string) (string, bool) {
	rest, ok := strings.CutPrefix(path, "/apis/discovery.k8s.io/v1/namespaces/")
	if !ok {
		return "", false
	}
	ns, kind, _ := strings.Cut(rest, "/")
	return ns, strings.HasPrefix(kind, "endpointslices")
}

// countingConfig is cfg with its slice writes counted in a new counter.
func countingConfig(cfg *rest.Config) (*rest.Config, *writeCounter) {
	w := &writeCounter{counts: map[string]*[3]int{}}
	c := rest.CopyConfig(cfg)
	c.Wrap(w.wrap)
	c.QPS, c.Burst = 100, 200
	c.WarningHandler = rest.NoWarnings{}
	return c, w
}

// running is an in-process controller under test.
type running struct {
	c      *Controller
	writes *writeCounter
}

// startController runs a Controller (without leader election) until the
// test ends.
func startController(t *testing.T, s *framework.APIServer, opts Options) *running {
	t.Helper()
	cfg, writes := countingConfig(s.RestConfig)
	client := kubernetes.NewForConfigOrDie(cfg)
	f := informer.New(client)
	views := kit.RegisterViews(f, Indexers())
	if opts.MaxEndpointsPerSlice == 0 {
		opts.MaxEndpointsPerSlice = 100
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() {
		cancel()
		<-done
	})
	f.Start(ctx)
	c, err := New(logrDiscard(), client, views.Sources(), record.NewFakeRecorder(1000), prometheus.NewRegistry(), opts)
	if err != nil {
		close(done)
		t.Fatal(err)
	}
	if !cache.WaitFor(ctx, "", append(views.Synced(), c.Synced()...)...) {
		close(done)
		t.Fatal("the controller's caches did not sync")
	}
	go func() {
		defer close(done)
		c.Run(ctx, 5)
	}()
	return &running{c: c, writes: writes}
}

// newNamespace creates a namespace for one test.
func newNamespace(t *testing.T, s *framework.APIServer, prefix string) string {
	t.Helper()
	ns, err := s.Client.CoreV1().Namespaces().Create(framework.Ctx(t), &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// createNode makes a Node with an optional zone label.
func createNode(t *testing.T, s *framework.APIServer, name, zone string) {
	t.Helper()
	n := newNode(name, zone)
	if _, err := s.Client.CoreV1().Nodes().Create(framework.Ctx(t), n, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Client.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
}

// createPod creates p in ns and sets its status (IPs, phase, Ready) as a
// kubelet would.
func createPod(t *testing.T, client kubernetes.Interface, ns string, p *corev1.Pod) *corev1.Pod {
	t.Helper()
	p = p.DeepCopy()
	p.Namespace, p.UID, p.ResourceVersion = ns, "", ""
	p.Spec.Containers[0].Image = "pause"
	for i := range p.Spec.InitContainers {
		p.Spec.InitContainers[i].Image = "pause"
	}
	deleting := p.DeletionTimestamp != nil
	p.DeletionTimestamp = nil
	got, err := framework.CreatePod(framework.Ctx(t), client, p)
	if err != nil {
		t.Fatal(err)
	}
	if deleting {
		// A pod bound to a node stays terminating until its kubelet (absent
		// here) confirms, so a long grace period keeps it terminating.
		err := client.CoreV1().Pods(ns).Delete(framework.Ctx(t), got.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64(3600))})
		if err != nil {
			t.Fatal(err)
		}
	}
	return got
}

func createService(t *testing.T, client kubernetes.Interface, ns string, svc *corev1.Service) *corev1.Service {
	t.Helper()
	svc = svc.DeepCopy()
	svc.Namespace, svc.UID, svc.CreationTimestamp = ns, "", metav1.Time{}
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		svc.Spec.IPFamilies, svc.Spec.ClusterIP, svc.Spec.ClusterIPs = nil, "", nil
	} else if svc.Spec.ClusterIP != corev1.ClusterIPNone {
		svc.Spec.ClusterIP, svc.Spec.ClusterIPs = "", nil
	} else {
		svc.Spec.ClusterIPs = []string{corev1.ClusterIPNone}
	}
	if len(svc.Spec.IPFamilies) > 1 {
		svc.Spec.IPFamilyPolicy = new(corev1.IPFamilyPolicyRequireDualStack)
	}
	if len(svc.Spec.Ports) == 0 && svc.Spec.ClusterIP != corev1.ClusterIPNone {
		svc.Spec.Ports = []corev1.ServicePort{{Port: 80}}
	}
	got, err := client.CoreV1().Services(ns).Create(framework.Ctx(t), svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// listOwn lists the slices our controller manages for service name.
func listOwn(t *testing.T, client kubernetes.Interface, ns, name, managedBy string) []*discovery.EndpointSlice {
	t.Helper()
	list, err := client.DiscoveryV1().EndpointSlices(ns).List(framework.Ctx(t), metav1.ListOptions{
		LabelSelector: discovery.LabelServiceName + "=" + name + "," + discovery.LabelManagedBy + "=" + managedBy})
	if err != nil {
		t.Fatal(err)
	}
	var out []*discovery.EndpointSlice
	for i := range list.Items {
		out = append(out, &list.Items[i])
	}
	return out
}

// settle waits until the controller has been idle (empty queue, no sync in
// progress) for longer than its slice-event delay, so that write counts
// are final.
func (r *running) settle(t *testing.T) {
	t.Helper()
	var idleSince time.Time
	framework.Eventually(t, 30*time.Second, "controller idle", func() error {
		if !r.c.idle() {
			idleSince = time.Time{}
			return fmt.Errorf("queue length %d", r.c.queue.Len())
		}
		if idleSince.IsZero() {
			idleSince = time.Now()
		}
		if idle := time.Since(idleSince); idle <= sliceChangeMinDelay+500*time.Millisecond {
			return fmt.Errorf("idle for %v only", idle)
		}
		return nil
	})
}
