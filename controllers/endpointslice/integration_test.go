package endpointslice

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/netplane/netplane/e2e/framework"
)

// TestAgainstAPIServer is the table of (Service, Pods, Nodes, existing
// slices, max per slice) → the slices on a real kube-apiserver and the exact
// number of creates, updates and deletes the controller sent. It is long
// because of that table.
func TestAgainstAPIServer(t *testing.T) {
	s := framework.SharedAPIServer(t, framework.Options{})
	cases := []struct {
		name       string
		svc        *corev1.Service
		pods       []runtime.Object
		nodeZone   string
		seedSizes  []int // existing slices, made from the first pods in order
		max        int32
		wantSizes  []int
		wantWrites [3]int // creates, updates, deletes
		check      func(t *testing.T, got []*discovery.EndpointSlice)
	}{
		{name: "placeholder for a Service without pods", svc: newService("a"),
			wantSizes: []int{0}, wantWrites: [3]int{1, 0, 0}},
		{name: "250 pods in 3 slices", svc: newService("a"), pods: newPods("a", 250),
			wantSizes: []int{50, 100, 100}, wantWrites: [3]int{3, 0, 0}},
		{name: "max 80", svc: newService("a"), pods: newPods("a", 250), max: 80,
			wantSizes: []int{10, 80, 80, 80}, wantWrites: [3]int{4, 0, 0}},
		{name: "existing 62+61 with 250 pods: one update, one create", svc: newService("a"), pods: newPods("a", 250),
			seedSizes: []int{62, 61}, wantSizes: []int{61, 89, 100}, wantWrites: [3]int{1, 1, 0}},
		{name: "existing 74+74 with 300 pods: two creates, no rebalancing", svc: newService("a"), pods: newPods("a", 300),
			seedSizes: []int{74, 74}, wantSizes: []int{52, 74, 74, 100}, wantWrites: [3]int{2, 0, 0}},
		{name: "existing placeholder is filled in place", svc: newService("a"), pods: newPods("a", 3),
			seedSizes: []int{0}, wantSizes: []int{3}, wantWrites: [3]int{0, 1, 0}},
		{name: "existing correct slices are left alone", svc: newService("a"), pods: newPods("a", 150),
			seedSizes: []int{100, 50}, wantSizes: []int{50, 100}, wantWrites: [3]int{0, 0, 0}},
		{name: "dual-stack", svc: newService("a", dualStack), pods: newPods("a", 3),
			wantSizes: []int{3, 3}, wantWrites: [3]int{2, 0, 0},
			check: func(t *testing.T, got []*discovery.EndpointSlice) {
				var types []string
				for _, s := range got {
					types = append(types, string(s.AddressType))
				}
				slices.Sort(types)
				if !slices.Equal(types, []string{"IPv4", "IPv6"}) {
					t.Errorf("address types %v", types)
				}
			}},
		{name: "named port resolving to 3 numbers", svc: newService("a", namedPort("http")),
			pods: func() []runtime.Object {
				var out []runtime.Object
				for i := range 9 {
					out = append(out, newPod("a", i, func(p *corev1.Pod) { p.Spec.Containers[0].Ports[0].ContainerPort = int32(8000 + i%3) }))
				}
				return out
			}(), wantSizes: []int{3, 3, 3}, wantWrites: [3]int{3, 0, 0}},
		{name: "pods on a missing Node are left out", svc: newService("a"),
			pods:      []runtime.Object{newPod("a", 0), newPod("a", 1, onNode("missing"))},
			wantSizes: []int{1}, wantWrites: [3]int{1, 0, 0}},
		{name: "terminating and unready pods are published with their conditions", svc: newService("a"),
			pods:      []runtime.Object{newPod("a", 0), newPod("a", 1, notReady), newPod("a", 2, terminating)},
			wantSizes: []int{3}, wantWrites: [3]int{1, 0, 0},
			check: func(t *testing.T, got []*discovery.EndpointSlice) {
				want := map[string][3]bool{"a-0": {true, true, false}, "a-1": {false, false, false}, "a-2": {false, true, true}}
				for _, e := range got[0].Endpoints {
					c := e.Conditions
					if w := want[e.TargetRef.Name]; [3]bool{*c.Ready, *c.Serving, *c.Terminating} != w {
						t.Errorf("%s: ready/serving/terminating %v/%v/%v, want %v", e.TargetRef.Name, *c.Ready, *c.Serving, *c.Terminating, w)
					}
				}
			}},
		{name: "zone, hostname, labels and owner", nodeZone: "zone-a",
			svc:       newService("a", func(s *corev1.Service) { s.Labels = map[string]string{"team": "x"} }),
			pods:      []runtime.Object{newPod("a", 0, func(p *corev1.Pod) { p.Spec.Hostname, p.Spec.Subdomain = "web", "a" })},
			wantSizes: []int{1}, wantWrites: [3]int{1, 0, 0},
			check: func(t *testing.T, got []*discovery.EndpointSlice) {
				e := got[0].Endpoints[0]
				if e.Zone == nil || *e.Zone != "zone-a" || e.Hostname == nil || *e.Hostname != "web" || *e.NodeName != "node-1" {
					t.Errorf("endpoint %+v: want zone-a, hostname web, node-1", e)
				}
				if got[0].Labels["team"] != "x" || got[0].OwnerReferences[0].Kind != "Service" {
					t.Errorf("labels %v owners %v", got[0].Labels, got[0].OwnerReferences)
				}
			}},
		{name: "ExternalName gets no slices", svc: newService("a", func(s *corev1.Service) {
			s.Spec.Type, s.Spec.ExternalName, s.Spec.Ports = corev1.ServiceTypeExternalName, "example.com", nil
		}), pods: newPods("a", 2), wantSizes: nil, wantWrites: [3]int{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ns := newNamespace(t, s, "table")
			createNode(t, s, "node-1", tc.nodeZone)
			svc := createService(t, s.Client, ns, tc.svc)
			t.Cleanup(func() { s.Client.CoreV1().Services(ns).Delete(context.Background(), svc.Name, metav1.DeleteOptions{}) })
			var pods []*corev1.Pod
			for _, p := range tc.pods {
				pods = append(pods, createPod(t, s.Client, ns, p.(*corev1.Pod)))
			}
			seed(t, s, svc, pods, tc.seedSizes)
			r := startController(t, s, Options{MaxEndpointsPerSlice: tc.max})
			framework.Eventually(t, 30*time.Second, "slices", func() error {
				got := sizes(listOwn(t, s.Client, ns, svc.Name, ControllerName))
				if !slices.Equal(got, tc.wantSizes) {
					return fmt.Errorf("sizes %v, want %v", got, tc.wantSizes)
				}
				return nil
			})
			r.settle(t)
			if got := r.writes.Get(ns); got != tc.wantWrites {
				t.Errorf("writes (creates, updates, deletes) %v, want %v", got, tc.wantWrites)
			}
			got := listOwn(t, s.Client, ns, svc.Name, ControllerName)
			if !slices.Equal(sizes(got), tc.wantSizes) {
				t.Errorf("after settling: sizes %v, want %v", sizes(got), tc.wantSizes)
			}
			if tc.check != nil {
				tc.check(t, got)
			}
		})
	}
}

func dualStack(s *corev1.Service) {
	s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
}

// seed creates existing slices of the given sizes for svc, as an earlier
// run of the controller would have written them: pods are taken in order.
func seed(t *testing.T, s *framework.APIServer, svc *corev1.Service, pods []*corev1.Pod, sizes []int) {
	t.Helper()
	node, err := s.Client.CoreV1().Nodes().Get(framework.Ctx(t), "node-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	next := 0
	for _, n := range sizes {
		fx := newFixture(t, 1000)
		fx.add(svc, node)
		for _, p := range pods[next : next+n] {
			fx.add(p)
		}
		next += n
		slice := fx.sync(svc).creates[0]
		slice.Name, slice.ResourceVersion, slice.Generation = "", "", 0
		if _, err := s.Client.DiscoveryV1().EndpointSlices(svc.Namespace).Create(framework.Ctx(t), slice, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}
