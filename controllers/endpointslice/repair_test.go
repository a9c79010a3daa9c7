package endpointslice

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netplane/netplane/e2e/framework"
)

// setup creates a namespace, node-1, Service a and n pods, and runs a
// controller that has converged on them.
func setup(t *testing.T, n int, opts Options) (*framework.APIServer, string, *corev1.Service, *running) {
	s := framework.SharedAPIServer(t, framework.Options{})
	ns := newNamespace(t, s, "repair")
	createNode(t, s, "node-1", "zone-a")
	svc := createService(t, s.Client, ns, newService("a"))
	t.Cleanup(func() { s.Client.CoreV1().Services(ns).Delete(context.Background(), "a", metav1.DeleteOptions{}) })
	for i := range n {
		createPod(t, s.Client, ns, newPod("a", i))
	}
	r := startController(t, s, opts)
	waitEndpoints(t, s, ns, "a", n)
	return s, ns, svc, r
}

func TestHandEditedSliceIsCorrected(t *testing.T) {
	s, ns, _, _ := setup(t, 3, Options{})
	slice := listOwn(t, s.Client, ns, "a", ControllerName)[0]
	slice.Endpoints = slice.Endpoints[:1]
	slice.Endpoints[0].Addresses = []string{"192.0.2.99"}
	if _, err := s.Client.DiscoveryV1().EndpointSlices(ns).Update(framework.Ctx(t), slice, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, 30*time.Second, "slice repaired", func() error {
		got := listOwn(t, s.Client, ns, "a", ControllerName)
		var addrs []string
		for _, s := range got {
			for _, e := range s.Endpoints {
				addrs = append(addrs, e.Addresses[0])
			}
		}
		slices.Sort(addrs)
		if !slices.Equal(addrs, []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"}) {
			return fmt.Errorf("addresses %v", addrs)
		}
		return nil
	})
}

func TestHandDeletedSliceIsRecreated(t *testing.T) {
	s, ns, _, _ := setup(t, 3, Options{})
	slice := listOwn(t, s.Client, ns, "a", ControllerName)[0]
	if err := s.Client.DiscoveryV1().EndpointSlices(ns).Delete(framework.Ctx(t), slice.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, 30*time.Second, "slice recreated", func() error {
		got := listOwn(t, s.Client, ns, "a", ControllerName)
		names, _ := endpointNames(got)
		if !(len(got) == 1 && got[0].Name != slice.Name && names.Len() == 3) {
			return fmt.Errorf("%d slices", len(got))
		}
		return nil
	})
}

func TestForeignSliceIsLeftAlone(t *testing.T) {
	s, ns, _, r := setup(t, 2, Options{})
	foreign := &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "by-hand", Labels: map[string]string{
			discovery.LabelServiceName: "a", discovery.LabelManagedBy: "someone-else"}},
		AddressType: discovery.AddressTypeIPv4,
		Endpoints:   []discovery.Endpoint{{Addresses: []string{"192.0.2.1"}}},
	}
	if _, err := s.Client.DiscoveryV1().EndpointSlices(ns).Create(framework.Ctx(t), foreign, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.settle(t)
	before := r.writes.Get(ns)
	foreign.Endpoints[0].Addresses = []string{"192.0.2.2"}
	got, err := s.Client.DiscoveryV1().EndpointSlices(ns).Get(framework.Ctx(t), "by-hand", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got.Endpoints = foreign.Endpoints
	if _, err := s.Client.DiscoveryV1().EndpointSlices(ns).Update(framework.Ctx(t), got, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.settle(t)
	if after := r.writes.Get(ns); after != before {
		t.Errorf("writes went from %v to %v after a foreign slice changed", before, after)
	}
	if _, err := s.Client.DiscoveryV1().EndpointSlices(ns).Get(framework.Ctx(t), "by-hand", metav1.GetOptions{}); err != nil {
		t.Errorf("foreign slice: %v", err)
	}
}

// TestRecreatedServiceGetsFreshSlices: no garbage collector runs here, so
// the old Service's slices survive its deletion, as they may for a while in
// a real cluster; the controller must replace them, not adopt them.
func TestRecreatedServiceGetsFreshSlices(t *testing.T) {
	s, ns, old, _ := setup(t, 2, Options{})
	if err := s.Client.CoreV1().Services(ns).Delete(framework.Ctx(t), "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := createService(t, s.Client, ns, newService("a"))
	framework.Eventually(t, 30*time.Second, "slices owned by the new Service", func() error {
		got := listOwn(t, s.Client, ns, "a", ControllerName)
		var owners []string
		for _, s := range got {
			owners = append(owners, string(s.OwnerReferences[0].UID))
		}
		names, _ := endpointNames(got)
		ok := len(got) == 1 && owners[0] == string(svc.UID) && names.Len() == 2
		if !ok {
			return fmt.Errorf("owners %v (old %s, new %s)", owners, old.UID, svc.UID)
		}
		return nil
	})
}

func TestPodOnLateNodeIsAddedWhenTheNodeAppears(t *testing.T) {
	s, ns, _, _ := setup(t, 1, Options{})
	createPod(t, s.Client, ns, newPod("a", 1, onNode("late-node")))
	createNode(t, s, "late-node", "zone-b")
	// Node events do not trigger syncs; the retry with backoff does.
	waitEndpoints(t, s, ns, "a", 2)
}

// TestChurn scales a Service up and down, flips readiness and deletes pods
// at random while the controller runs; afterwards the slices must equal a
// fresh computation, with no endpoint duplicated or lost.
func TestChurn(t *testing.T) {
	s, ns, svc, _ := setup(t, 20, Options{MaxEndpointsPerSlice: 10})
	rng := rand.New(rand.NewPCG(1, 2))
	live := map[string]bool{}
	for i := range 20 {
		live[fmt.Sprintf("a-%d", i)] = true
	}
	next := 20
	pods := s.Client.CoreV1().Pods(ns)
	for range 150 {
		names := slices.Sorted(maps.Keys(live))
		switch op := rng.IntN(10); {
		case op < 3 || len(names) < 5: // scale up
			createPod(t, s.Client, ns, newPod("a", next))
			live[fmt.Sprintf("a-%d", next)] = true
			next++
		case op < 5: // scale down
			name := names[rng.IntN(len(names))]
			if err := pods.Delete(framework.Ctx(t), name, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))}); err != nil {
				t.Fatal(err)
			}
			delete(live, name)
		default: // flip readiness
			name := names[rng.IntN(len(names))]
			p, err := pods.Get(framework.Ctx(t), name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			c := &p.Status.Conditions[0]
			c.Status = map[corev1.ConditionStatus]corev1.ConditionStatus{corev1.ConditionTrue: corev1.ConditionFalse, corev1.ConditionFalse: corev1.ConditionTrue}[c.Status]
			c.LastTransitionTime = metav1.Now()
			if _, err := pods.UpdateStatus(framework.Ctx(t), p, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The fresh computation: the library on the final API state.
	want := freshEndpoints(t, s, svc, 10)
	framework.Eventually(t, 60*time.Second, "slices equal a fresh computation", func() error {
		got := listOwn(t, s.Client, ns, "a", ControllerName)
		_, dups := endpointNames(got)
		g := endpointSummary(got)
		if !(dups == 0 && slices.Equal(g, want)) {
			return fmt.Errorf("%d duplicates; got %d endpoints, want %d", dups, len(g), len(want))
		}
		return nil
	})
}

// freshEndpoints computes svc's endpoints from scratch from the API's
// current pods, with the same library and no existing slices.
func freshEndpoints(t *testing.T, s *framework.APIServer, svc *corev1.Service, maxPerSlice int32) []string {
	t.Helper()
	fx := newFixture(t, maxPerSlice)
	node, err := s.Client.CoreV1().Nodes().Get(framework.Ctx(t), "node-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fx.add(svc, node)
	list, err := s.Client.CoreV1().Pods(svc.Namespace).List(framework.Ctx(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range list.Items {
		fx.add(&list.Items[i])
	}
	return endpointSummary(fx.sync(svc).creates)
}

// endpointSummary lists "pod address ready serving terminating", sorted.
func endpointSummary(ss []*discovery.EndpointSlice) []string {
	var out []string
	for _, s := range ss {
		for _, e := range s.Endpoints {
			c := e.Conditions
			out = append(out, fmt.Sprintf("%s %s %v %v %v", e.TargetRef.Name, e.Addresses[0], *c.Ready, *c.Serving, *c.Terminating))
		}
	}
	slices.Sort(out)
	return out
}

// TestBatchPeriodCoalescesPodChanges: pods that change within one batch
// period cost one slice write, not one each.
func TestBatchPeriodCoalescesPodChanges(t *testing.T) {
	s, ns, _, r := setup(t, 1, Options{BatchPeriod: 2 * time.Second})
	r.settle(t)
	before := r.writes.Get(ns)
	start := time.Now()
	for i := 1; i <= 3; i++ {
		createPod(t, s.Client, ns, newPod("a", i))
	}
	if elapsed := time.Since(start); elapsed > time.Second {
		t.Skipf("creating 3 pods took %v, too slow for a 2s batch window on this machine", elapsed)
	}
	waitEndpoints(t, s, ns, "a", 4)
	r.settle(t)
	after := r.writes.Get(ns)
	if d := [3]int{after[0] - before[0], after[1] - before[1], after[2] - before[2]}; d != [3]int{0, 1, 0} {
		t.Errorf("3 pod changes in one batch period wrote %v (creates, updates, deletes), want one update", d)
	}
}

// TestFlipsInAServiceOfManySlicesEachCostOneUpdate: readiness flips, one
// at a time, of pods of a Service in four slices each show at once and
// cost one update (the sync plans only the flipped pod's slice), and the
// slices end as a fresh computation makes them.
func TestFlipsInAServiceOfManySlicesEachCostOneUpdate(t *testing.T) {
	s, ns, svc, r := setup(t, 40, Options{MaxEndpointsPerSlice: 10})
	r.settle(t)
	before := r.writes.Get(ns)
	pods := s.Client.CoreV1().Pods(ns)
	flips := []int{3, 17, 22, 38, 9, 30}
	for _, i := range flips {
		name := fmt.Sprintf("a-%d", i)
		p, err := pods.Get(framework.Ctx(t), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.Status.Conditions[0].Status = corev1.ConditionFalse
		if _, err := pods.UpdateStatus(framework.Ctx(t), p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		framework.Eventually(t, 10*time.Second, name+" not ready in its slice", func() error {
			for _, sl := range listOwn(t, s.Client, ns, "a", ControllerName) {
				for _, e := range sl.Endpoints {
					if e.TargetRef.Name == name && !*e.Conditions.Ready {
						return nil
					}
				}
			}
			return errors.New("still ready")
		})
	}
	r.settle(t)
	after := r.writes.Get(ns)
	if d := [3]int{after[0] - before[0], after[1] - before[1], after[2] - before[2]}; d != [3]int{0, len(flips), 0} {
		t.Errorf("%d flips wrote %v (creates, updates, deletes), want %d updates", len(flips), d, len(flips))
	}
	if got, want := endpointSummary(listOwn(t, s.Client, ns, "a", ControllerName)), freshEndpoints(t, s, svc, 10); !slices.Equal(got, want) {
		t.Errorf("slices differ from a fresh computation:\n%s", firstDifference(got, want))
	}
}
