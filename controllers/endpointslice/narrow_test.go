package endpointslice

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// narrowWorld is a Service of 250 pods in slices of 100, 100 and 50 (pods
// a-0.. in order) as the last sync saw them, changed by change.
type narrowWorld struct {
	svc    *corev1.Service
	nodes  uint64
	pods   []*corev1.Pod
	slices []*discovery.EndpointSlice
	// written are the slices at a generation the controller wrote.
	written map[types.UID]bool
}

func newNarrowWorld() *narrowWorld {
	w := &narrowWorld{svc: newService("a", func(s *corev1.Service) { s.ResourceVersion = "10" }), nodes: 1, written: map[types.UID]bool{}}
	for i := range 250 {
		w.pods = append(w.pods, newPod("a", i))
	}
	for i, size := range []int{100, 100, 50} {
		s := &discovery.EndpointSlice{AddressType: discovery.AddressTypeIPv4}
		s.Name, s.UID, s.Generation = fmt.Sprintf("a-%d", i), types.UID(fmt.Sprintf("slice-%d", i)), 1
		for _, p := range w.pods[i*100 : i*100+size] {
			s.Endpoints = append(s.Endpoints, discovery.Endpoint{Addresses: []string{p.Status.PodIP},
				TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: p.Namespace, Name: p.Name}})
		}
		w.slices = append(w.slices, s)
	}
	return w
}

// flip makes pod i not ready, as a new version of it.
func (w *narrowWorld) flip(i int) {
	p := w.pods[i].DeepCopy()
	notReady(p)
	p.ResourceVersion = "20"
	w.pods[i] = p
}

// rewrite gives slice i a new generation, written by the controller or not.
func (w *narrowWorld) rewrite(i int, ours bool) {
	s := w.slices[i].DeepCopy()
	s.Generation++
	w.slices[i] = s
	w.written[s.UID] = ours
}

func TestNarrow(t *testing.T) {
	cases := []struct {
		name   string
		change func(w *narrowWorld)
		// wantSlices are the slices the planner gets (nil: everything).
		wantSlices []string
		wantPods   int
	}{
		{name: "nothing changed leaves nothing to plan", change: func(*narrowWorld) {}, wantSlices: []string{}},
		{name: "a flip plans only its slice, cut to the pod's endpoint",
			change: func(w *narrowWorld) { w.flip(120) }, wantSlices: []string{"a-1 [a-120]"}, wantPods: 1},
		{name: "flips in two slices plan both",
			change: func(w *narrowWorld) { w.flip(3); w.flip(220) }, wantSlices: []string{"a-0 [a-3]", "a-2 [a-220]"}, wantPods: 2},
		{name: "flips in one slice plan it cut to both, in the slice's order",
			change: func(w *narrowWorld) { w.flip(150); w.flip(101) }, wantSlices: []string{"a-1 [a-101 a-150]"}, wantPods: 2},
		{name: "a pod without a resourceVersion counts as changed",
			change:     func(w *narrowWorld) { w.pods[230] = w.pods[230].DeepCopy(); w.pods[230].ResourceVersion = "" },
			wantSlices: []string{"a-2 [a-230]"}, wantPods: 1},
		{name: "a slice at a generation we wrote is as planned",
			change: func(w *narrowWorld) { w.rewrite(0, true); w.flip(120) }, wantSlices: []string{"a-1 [a-120]"}, wantPods: 1},
		{name: "a slice changed by someone else plans everything", change: func(w *narrowWorld) { w.rewrite(0, false); w.flip(120) }},
		{name: "a slice gone plans everything", change: func(w *narrowWorld) { w.slices = w.slices[:2] }},
		{name: "a new slice we did not write plans everything", change: func(w *narrowWorld) {
			s := w.slices[2].DeepCopy()
			s.UID = "slice-new"
			w.slices = append(w.slices, s)
		}},
		{name: "a new pod plans everything", change: func(w *narrowWorld) { w.pods = append(w.pods, newPod("a", 250)) }},
		{name: "a pod gone plans everything", change: func(w *narrowWorld) { w.pods = w.pods[1:] }},
		{name: "a pod replaced by another plans everything", change: func(w *narrowWorld) { w.pods[0] = newPod("a", 250) }},
		{name: "a pod that turned terminal plans everything", change: func(w *narrowWorld) {
			w.flip(5)
			w.pods[5].Status.Phase = corev1.PodFailed
		}},
		{name: "a pod whose IP changed plans everything", change: func(w *narrowWorld) {
			w.flip(5)
			w.pods[5].Status.PodIPs[0].IP = "10.9.9.9"
		}},
		{name: "a changed Service plans everything", change: func(w *narrowWorld) { w.flip(5); w.svc.ResourceVersion = "11" }},
		{name: "a Service without a resourceVersion plans everything", change: func(w *narrowWorld) { w.svc.ResourceVersion = "" }},
		{name: "a Node change plans everything", change: func(w *narrowWorld) { w.flip(5); w.nodes++ }},
		{name: "a dual-stack Service plans everything", change: func(w *narrowWorld) {
			w.flip(5)
			w.svc.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
		}},
		{name: "topology-aware hints plan everything", change: func(w *narrowWorld) {
			w.flip(5)
			w.svc.Annotations = map[string]string{corev1.AnnotationTopologyMode: "Auto"}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := newNarrowWorld()
			last := recordSync(w.svc, w.nodes, w.pods, w.slices)
			w.svc = w.svc.DeepCopy()
			tc.change(w)
			n, ok := narrow(last, w.svc, w.nodes, w.pods, w.slices, func(s *discovery.EndpointSlice) bool { return w.written[s.UID] })
			if tc.wantSlices == nil {
				if ok {
					t.Errorf("narrowed to %v; want everything planned", sliceNames(n.slices))
				}
				return
			}
			if !ok {
				t.Fatalf("everything planned; want slices %v", tc.wantSlices)
			}
			if got := cutNames(n.slices); !slices.Equal(got, tc.wantSlices) || len(n.pods) != tc.wantPods {
				t.Errorf("planned slices %v with %d pods; want %v with %d", got, len(n.pods), tc.wantSlices, tc.wantPods)
			}
			for _, part := range n.slices {
				whole, ok := splice(part, n.cuts[part.Name])
				if !ok || len(whole.Endpoints) != 100 && len(whole.Endpoints) != 50 {
					t.Errorf("slice %s does not splice back into its whole", part.Name)
				}
			}
		})
	}
	t.Run("without a last sync everything is planned", func(t *testing.T) {
		w := newNarrowWorld()
		if _, ok := narrow(nil, w.svc, w.nodes, w.pods, w.slices, func(*discovery.EndpointSlice) bool { return true }); ok {
			t.Error("narrowed without a last sync")
		}
	})
}

// cutNames names each slice with the pods of its endpoints, sorted by name.
func cutNames(ss []*discovery.EndpointSlice) []string {
	out := []string{}
	for _, s := range ss {
		var pods []string
		for _, e := range s.Endpoints {
			pods = append(pods, e.TargetRef.Name)
		}
		out = append(out, fmt.Sprintf("%s %v", s.Name, pods))
	}
	slices.Sort(out)
	return out
}

func sliceNames(ss []*discovery.EndpointSlice) []string {
	out := []string{}
	for _, s := range ss {
		out = append(out, s.Name)
	}
	slices.Sort(out)
	return out
}

// TestNarrowedSyncWritesWhatAFullSyncWrites syncs the same change twice:
// by a controller that synced the Service before (and narrows), and by a
// fresh one that plans everything; the writes must be the same.
func TestNarrowedSyncWritesWhatAFullSyncWrites(t *testing.T) {
	terminatingPod := func(p *corev1.Pod) { terminating(p) }
	// A pod whose container port moved: its endpoint leaves its slice for
	// one of the new port, which a cut slice cannot answer.
	portMoved := func(p *corev1.Pod) { p.Spec.Containers[0].Ports[0].ContainerPort = 9090 }
	type at struct{ slice, endpoint int } // by the slices' place in name order
	cases := []struct {
		name string
		// change changes the pods at the places it names (the first sync
		// packs pods in random order).
		change    map[at]podOpt
		narrowed  bool
		namedPort bool // the Service's targetPort is the container port's name
		updates   int
	}{
		{"one flip", map[at]podOpt{{1, 37}: notReady}, true, false, 1},
		{"flips in two slices", map[at]podOpt{{0, 0}: notReady, {2, 49}: notReady}, true, false, 2},
		{"two flips in one slice", map[at]podOpt{{1, 99}: notReady, {1, 3}: notReady}, true, false, 1},
		{"a terminating pod", map[at]podOpt{{2, 20}: terminatingPod}, true, false, 1},
		{"a terminal pod leaves", map[at]podOpt{{2, 20}: func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }}, false, false, 1},
		{"a pod without a change", map[at]podOpt{{0, 50}: func(*corev1.Pod) {}}, true, false, 0},
		{"a named port that moved", map[at]podOpt{{1, 37}: portMoved}, true, true, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			svc := newService("a", func(s *corev1.Service) {
				s.ResourceVersion = "10"
				if tc.namedPort {
					s.Spec.Ports[0].TargetPort = intstr.FromString("http")
				}
			})
			warm := newFixture(t, 100)
			warm.add(svc, newNode("node-1", "z"))
			warm.add(newPods("a", 250)...)
			if w := warm.sync(svc); w.err != nil || w.counts() != [3]int{3, 0, 0} {
				t.Fatalf("first sync: writes %v err %v", w.counts(), w.err)
			}
			cold := newFixture(t, 100)
			cold.add(svc, newNode("node-1", "z"))
			cold.add(newPods("a", 250)...)
			written := warm.slicesOf(svc)
			slices.SortFunc(written, func(a, b *discovery.EndpointSlice) int { return strings.Compare(a.Name, b.Name) })
			for _, s := range written {
				cold.add(s)
				if err := cold.client.Tracker().Add(s); err != nil {
					t.Fatal(err)
				}
			}
			for i, opt := range tc.change {
				var n int
				if _, err := fmt.Sscanf(written[i.slice].Endpoints[i.endpoint].TargetRef.Name, "a-%d", &n); err != nil {
					t.Fatal(err)
				}
				p := newPod("a", n, opt)
				p.ResourceVersion = "2"
				warm.add(p)
				cold.add(p)
			}
			key := svc.Namespace + "/" + svc.Name
			pods, err := selectPods(warm.c.podIndex, nil, "ns", svc.Spec.Selector)
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := narrow(warm.c.last.get(key), svc, warm.c.nodeEpoch.Load(), pods, warm.slicesOf(svc), warm.c.written); ok != tc.narrowed {
				t.Fatalf("narrowed %v, want %v", ok, tc.narrowed)
			}
			got, want := warm.sync(svc), cold.sync(svc)
			if got.err != nil || want.err != nil {
				t.Fatalf("errors: narrowed %v, full %v", got.err, want.err)
			}
			if got.counts() != want.counts() || len(got.updates) != tc.updates {
				t.Fatalf("writes %v, full sync %v; want %d updates", got.counts(), want.counts(), tc.updates)
			}
			if g, w := canonicalWrites(got.updates), canonicalWrites(want.updates); !slices.Equal(g, w) {
				t.Errorf("updates differ from the full sync's:\n%s", firstDifference(g, w))
			}
		})
	}
}

// canonicalWrites renders written slices as sorted lines, one per slice:
// its name, labels and ports, and each endpoint in order with its
// conditions.
func canonicalWrites(ss []*discovery.EndpointSlice) []string {
	var out []string
	for _, s := range ss {
		var eps []string
		for _, e := range s.Endpoints {
			eps = append(eps, fmt.Sprintf("%s r=%v s=%v t=%v", e.TargetRef.Name, *e.Conditions.Ready, *e.Conditions.Serving, *e.Conditions.Terminating))
		}
		out = append(out, fmt.Sprintf("%s %v %v %v", s.Name, s.Labels, portNumbers(s), eps))
	}
	slices.Sort(out)
	return out
}
