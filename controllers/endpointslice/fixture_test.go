package endpointslice

import (
	"slices"
	"sort"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
)

// fixture runs the Controller's sync on hand-filled informer caches and a
// fake clientset: the pure core (Service, Pods, Nodes, slices, max) →
// writes, without an API server.
type fixture struct {
	t      *testing.T
	client *fake.Clientset
	f      informers.SharedInformerFactory
	c      *Controller
	events *record.FakeRecorder
	// written collects the slices each sync created and updated.
	written map[string][]*discovery.EndpointSlice
}

func newFixture(t *testing.T, maxPerSlice int32) *fixture {
	t.Helper()
	written := map[string][]*discovery.EndpointSlice{}
	client := newFakeClient(func(verb string, s *discovery.EndpointSlice) { written[verb] = append(written[verb], s) })
	f := informers.NewSharedInformerFactory(client, 0)
	events := record.NewFakeRecorder(100)
	c, err := New(logrDiscard(), client, sourcesOf(f), events, prometheus.NewRegistry(), Options{MaxEndpointsPerSlice: maxPerSlice})
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{t: t, client: client, f: f, c: c, events: events, written: written}
}

// add puts objects into the informer caches (not the fake API).
func (fx *fixture) add(objs ...runtime.Object) {
	fx.t.Helper()
	for _, o := range objs {
		var err error
		switch o := o.(type) {
		case *corev1.Service:
			err = fx.f.Core().V1().Services().Informer().GetIndexer().Add(o)
		case *corev1.Pod:
			err = fx.f.Core().V1().Pods().Informer().GetIndexer().Add(o)
		case *corev1.Node:
			err = fx.f.Core().V1().Nodes().Informer().GetIndexer().Add(o)
		case *discovery.EndpointSlice:
			err = fx.f.Discovery().V1().EndpointSlices().Informer().GetIndexer().Add(o)
		default:
			fx.t.Fatalf("fixture cannot hold %T", o)
		}
		if err != nil {
			fx.t.Fatal(err)
		}
	}
}

// writes is what one sync did.
type writes struct {
	creates, updates []*discovery.EndpointSlice
	deletes          []string
	err              error
}

func (w writes) counts() [3]int { return [3]int{len(w.creates), len(w.updates), len(w.deletes)} }

// sync runs one sync of svc and returns its writes. The informer cache is
// then brought up to date with them, as a watch would.
func (fx *fixture) sync(svc *corev1.Service) writes {
	fx.t.Helper()
	fx.client.ClearActions()
	err := fx.c.syncService(svc.Namespace + "/" + svc.Name)
	w := writes{err: err}
	idx := fx.f.Discovery().V1().EndpointSlices().Informer().GetIndexer()
	for _, a := range fx.client.Actions() {
		switch a := a.(type) {
		case k8stesting.DeleteAction:
			w.deletes = append(w.deletes, a.GetName())
			if o, ok, _ := idx.GetByKey(a.GetNamespace() + "/" + a.GetName()); ok {
				idx.Delete(o)
			}
		}
	}
	w.creates, w.updates = fx.written["create"], fx.written["update"]
	for _, s := range append(slices.Clone(w.creates), w.updates...) {
		idx.Update(s)
	}
	clear(fx.written)
	return w
}

// slicesOf lists the slices in the cache for svc, managed by us.
func (fx *fixture) slicesOf(svc *corev1.Service) []*discovery.EndpointSlice {
	fx.t.Helper()
	s, err := fx.c.ownSlices(svc)
	if err != nil {
		fx.t.Fatal(err)
	}
	return s
}

// sizes lists the endpoint counts of slices, sorted.
func sizes(ss []*discovery.EndpointSlice) []int {
	var out []int
	for _, s := range ss {
		out = append(out, len(s.Endpoints))
	}
	sort.Ints(out)
	return out
}

func notReady(p *corev1.Pod) { p.Status.Conditions[0].Status = corev1.ConditionFalse }

func terminating(p *corev1.Pod) { p.DeletionTimestamp = new(metav1.Now()) }

func onNode(n string) podOpt { return func(p *corev1.Pod) { p.Spec.NodeName = n } }

func newPods(app string, n int, opts ...podOpt) []runtime.Object {
	var out []runtime.Object
	for i := range n {
		out = append(out, newPod(app, i, opts...))
	}
	return out
}

// onlyEndpoint returns the single endpoint of the single written slice.
func onlyEndpoint(t *testing.T, ss []*discovery.EndpointSlice) discovery.Endpoint {
	t.Helper()
	if len(ss) != 1 || len(ss[0].Endpoints) != 1 {
		t.Fatalf("want 1 slice with 1 endpoint, got %d slices with sizes %v", len(ss), sizes(ss))
	}
	return ss[0].Endpoints[0]
}

func portNumbers(s *discovery.EndpointSlice) []int32 {
	var out []int32
	for _, p := range s.Ports {
		out = append(out, *p.Port)
	}
	slices.Sort(out)
	return out
}
