package endpointslice

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/netplane/netplane/controllers/internal/kit"
	"github.com/netplane/netplane/e2e/framework"
)

// TestFirstSync is the table of (Service, Pods, Nodes, max) → the slices
// the first sync creates, with their sizes. It is long because of that
// table.
func TestFirstSync(t *testing.T) {
	zoneNode := newNode("node-1", "zone-a")
	cases := []struct {
		name      string
		svc       *corev1.Service
		objs      []runtime.Object
		max       int32
		wantSizes []int // sorted endpoint counts of the created slices
		check     func(t *testing.T, created []*discovery.EndpointSlice)
	}{
		{name: "no pods gives one empty placeholder", svc: newService("a"), wantSizes: []int{0},
			check: func(t *testing.T, c []*discovery.EndpointSlice) {
				s := c[0]
				if s.GenerateName != "a-" || len(s.Ports) != 0 || s.Endpoints == nil || s.Ports == nil {
					t.Errorf("placeholder: generateName %q ports %v endpoints %v; want a-, [], []", s.GenerateName, s.Ports, s.Endpoints)
				}
			}},
		{name: "250 pods pack into 100+100+50", svc: newService("a"), objs: newPods("a", 250), wantSizes: []int{50, 100, 100}},
		{name: "max 80 packs 250 into 80+80+80+10", svc: newService("a"), objs: newPods("a", 250), max: 80, wantSizes: []int{10, 80, 80, 80}},
		{name: "max 1000 fits 250 in one", svc: newService("a"), objs: newPods("a", 250), max: 1000, wantSizes: []int{250}},
		{name: "dual-stack gives a slice per family", wantSizes: []int{1, 1},
			svc: newService("a", func(s *corev1.Service) {
				s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
				s.Spec.ClusterIPs = []string{"10.96.0.10", "fd00:10:96::10"}
			}),
			objs: []runtime.Object{newPod("a", 0, func(p *corev1.Pod) { p.Status.PodIPs[1].IP = "fd00:0:0:0:0:0:0:1" })},
			check: func(t *testing.T, c []*discovery.EndpointSlice) {
				got := map[discovery.AddressType]string{}
				for _, s := range c {
					got[s.AddressType] = s.Endpoints[0].Addresses[0]
				}
				if got[discovery.AddressTypeIPv4] != "10.0.0.1" || got[discovery.AddressTypeIPv6] != "fd00::1" {
					t.Errorf("addresses by family %v; want IPv4 10.0.0.1 and canonical IPv6 fd00::1", got)
				}
			}},
		{name: "IPv6-only service ignores the IPv4 pod IP", wantSizes: []int{1},
			svc:  newService("a", func(s *corev1.Service) { s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol} }),
			objs: newPods("a", 1),
			check: func(t *testing.T, c []*discovery.EndpointSlice) {
				if c[0].AddressType != discovery.AddressTypeIPv6 {
					t.Errorf("address type %s, want IPv6", c[0].AddressType)
				}
			}},
		{name: "succeeded, failed and IP-less pods are left out", svc: newService("a"), wantSizes: []int{1},
			objs: []runtime.Object{
				newPod("a", 0),
				newPod("a", 1, func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }),
				newPod("a", 2, func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed }),
				newPod("a", 3, func(p *corev1.Pod) { p.Status.PodIP, p.Status.PodIPs = "", nil }),
				newPod("other", 4),
			}},
		{name: "pods on a missing Node are left out", svc: newService("a"), wantSizes: []int{1},
			objs: []runtime.Object{newPod("a", 0), newPod("a", 1, onNode("gone"))}},
		{name: "publishNotReadyAddresses keeps pods on a missing Node, without zone", wantSizes: []int{2},
			svc:  newService("a", func(s *corev1.Service) { s.Spec.PublishNotReadyAddresses = true }),
			objs: []runtime.Object{newPod("a", 0), newPod("a", 1, onNode("gone"))},
			check: func(t *testing.T, c []*discovery.EndpointSlice) {
				for _, e := range c[0].Endpoints {
					if *e.NodeName == "gone" && e.Zone != nil {
						t.Errorf("pod on a missing node got zone %q", *e.Zone)
					}
				}
			}},
		{name: "headless service without ports", wantSizes: []int{3},
			svc: newService("a", func(s *corev1.Service) {
				s.Spec.ClusterIP, s.Spec.ClusterIPs, s.Spec.Ports = corev1.ClusterIPNone, []string{corev1.ClusterIPNone}, nil
			}),
			objs: newPods("a", 3),
			check: func(t *testing.T, c []*discovery.EndpointSlice) {
				if _, ok := c[0].Labels[corev1.IsHeadlessService]; !ok || c[0].Ports == nil || len(c[0].Ports) != 0 {
					t.Errorf("labels %v ports %v; want the headless label and ports []", c[0].Labels, c[0].Ports)
				}
			}},
		{name: "named port resolving to 5 numbers gives 5 slices", svc: newService("a", namedPort("http")),
			objs: func() []runtime.Object {
				var out []runtime.Object
				for i := range 300 {
					out = append(out, newPod("a", i, func(p *corev1.Pod) { p.Spec.Containers[0].Ports[0].ContainerPort = int32(8000 + i%5) }))
				}
				return out
			}(), wantSizes: []int{60, 60, 60, 60, 60}},
		{name: "named port found in a sidecar init container", svc: newService("a", namedPort("metrics")), wantSizes: []int{1},
			objs: []runtime.Object{newPod("a", 0, func(p *corev1.Pod) {
				always := corev1.ContainerRestartPolicyAlways
				p.Spec.InitContainers = []corev1.Container{{Name: "side", RestartPolicy: &always,
					Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9090, Protocol: corev1.ProtocolTCP}}}}
			})},
			check: func(t *testing.T, c []*discovery.EndpointSlice) {
				if got := portNumbers(c[0]); !slices.Equal(got, []int32{9090}) {
					t.Errorf("ports %v, want [9090]", got)
				}
			}},
		{name: "an unresolvable named port is omitted for that pod only", wantSizes: []int{1, 1},
			svc: newService("a", func(s *corev1.Service) {
				s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "admin", Port: 81, TargetPort: intstr.FromString("admin"), Protocol: corev1.ProtocolTCP})
			}),
			objs: []runtime.Object{newPod("a", 0), newPod("a", 1, func(p *corev1.Pod) {
				p.Spec.Containers[0].Ports = append(p.Spec.Containers[0].Ports, corev1.ContainerPort{Name: "admin", ContainerPort: 9000, Protocol: corev1.ProtocolTCP})
			})},
			check: func(t *testing.T, c []*discovery.EndpointSlice) {
				var got [][]int32
				for _, s := range c {
					got = append(got, portNumbers(s))
				}
				slices.SortFunc(got, func(a, b []int32) int { return len(a) - len(b) })
				if len(got[0]) != 1 || !slices.Equal(got[1], []int32{8080, 9000}) {
					t.Errorf("port sets %v, want [8080] and [8080 9000]", got)
				}
			}},
		{name: "a named port with the wrong protocol does not resolve", wantSizes: []int{1},
			svc:  newService("a", namedPort("http"), func(s *corev1.Service) { s.Spec.Ports[0].Protocol = corev1.ProtocolUDP }),
			objs: newPods("a", 1),
			check: func(t *testing.T, c []*discovery.EndpointSlice) {
				if len(c[0].Ports) != 0 {
					t.Errorf("ports %v, want none", portNumbers(c[0]))
				}
			}},
		{name: "service labels are copied except reserved ones", wantSizes: []int{1},
			svc: newService("a", func(s *corev1.Service) {
				s.Labels = map[string]string{"team": "x", discovery.LabelManagedBy: "evil", discovery.LabelServiceName: "evil"}
			}),
			objs: newPods("a", 1),
			check: func(t *testing.T, c []*discovery.EndpointSlice) {
				l := c[0].Labels
				if l["team"] != "x" || l[discovery.LabelManagedBy] != ControllerName || l[discovery.LabelServiceName] != "a" {
					t.Errorf("labels %v", l)
				}
				if _, ok := l[corev1.IsHeadlessService]; ok {
					t.Errorf("a ClusterIP service got the headless label")
				}
				ref := c[0].OwnerReferences
				if len(ref) != 1 || ref[0].Kind != "Service" || ref[0].UID != "a-uid" || ref[0].Controller == nil || !*ref[0].Controller {
					t.Errorf("owner refs %+v, want a controller ref to Service a", ref)
				}
				if _, ok := c[0].Annotations[corev1.EndpointsLastChangeTriggerTime]; !ok {
					t.Errorf("no %s annotation", corev1.EndpointsLastChangeTriggerTime)
				}
			}},
		{name: "PreferClose sets zone hints on ready endpoints only", wantSizes: []int{2},
			svc:  newService("a", withTrafficDistribution(corev1.ServiceTrafficDistributionPreferClose)),
			objs: []runtime.Object{newPod("a", 0), newPod("a", 1, notReady)},
			check: func(t *testing.T, c []*discovery.EndpointSlice) {
				for _, e := range c[0].Endpoints {
					hinted := e.Hints != nil && len(e.Hints.ForZones) == 1 && e.Hints.ForZones[0].Name == "zone-a"
					if hinted != *e.Conditions.Ready {
						t.Errorf("endpoint %v ready=%v hints=%+v", e.Addresses, *e.Conditions.Ready, e.Hints)
					}
				}
			}},
		{name: "PreferSameNode adds node hints", wantSizes: []int{1},
			svc:  newService("a", withTrafficDistribution(corev1.ServiceTrafficDistributionPreferSameNode)),
			objs: newPods("a", 1),
			check: func(t *testing.T, c []*discovery.EndpointSlice) {
				h := c[0].Endpoints[0].Hints
				if h == nil || len(h.ForNodes) != 1 || h.ForNodes[0].Name != "node-1" {
					t.Errorf("hints %+v, want forNodes node-1", h)
				}
			}},
		{name: "no trafficDistribution, no hints", svc: newService("a"), objs: newPods("a", 1), wantSizes: []int{1},
			check: func(t *testing.T, c []*discovery.EndpointSlice) {
				if h := c[0].Endpoints[0].Hints; h != nil {
					t.Errorf("hints %+v, want none", h)
				}
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fx := newFixture(t, max(tc.max, 100))
			if tc.max != 0 {
				fx = newFixture(t, tc.max)
			}
			fx.add(tc.svc, zoneNode)
			fx.add(tc.objs...)
			w := fx.sync(tc.svc)
			if len(w.updates)+len(w.deletes) != 0 {
				t.Errorf("first sync updated %d and deleted %d slices, want only creates", len(w.updates), len(w.deletes))
			}
			if got := sizes(w.creates); !slices.Equal(got, tc.wantSizes) {
				t.Fatalf("created slice sizes %v, want %v", got, tc.wantSizes)
			}
			if tc.check != nil {
				tc.check(t, w.creates)
			}
			if w2 := fx.sync(tc.svc); w2.counts() != [3]int{} {
				t.Errorf("second sync wrote %v (creates, updates, deletes), want nothing", w2.counts())
			}
		})
	}
}

func namedPort(name string) svcOpt {
	return func(s *corev1.Service) { s.Spec.Ports[0].TargetPort = intstr.FromString(name) }
}

func withTrafficDistribution(td string) svcOpt {
	return func(s *corev1.Service) { s.Spec.TrafficDistribution = &td }
}

// TestEndpointConditions is the ready/serving/terminating table.
func TestEndpointConditions(t *testing.T) {
	cases := []struct {
		name                       string
		pnra                       bool
		opts                       []podOpt
		ready, serving, terminated bool
	}{
		{"ready", false, nil, true, true, false},
		{"not ready", false, []podOpt{notReady}, false, false, false},
		{"ready and terminating", false, []podOpt{terminating}, false, true, true},
		{"not ready and terminating", false, []podOpt{notReady, terminating}, false, false, true},
		{"not ready with publishNotReadyAddresses", true, []podOpt{notReady}, true, false, false},
		{"terminating with publishNotReadyAddresses", true, []podOpt{notReady, terminating}, true, false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fx := newFixture(t, 100)
			svc := newService("a", func(s *corev1.Service) { s.Spec.PublishNotReadyAddresses = tc.pnra })
			fx.add(svc, newNode("node-1", ""), newPod("a", 0, tc.opts...))
			e := onlyEndpoint(t, fx.sync(svc).creates)
			c := e.Conditions
			if c.Ready == nil || c.Serving == nil || c.Terminating == nil {
				t.Fatalf("conditions %+v: all three must be written", c)
			}
			if *c.Ready != tc.ready || *c.Serving != tc.serving || *c.Terminating != tc.terminated {
				t.Errorf("ready/serving/terminating = %v/%v/%v, want %v/%v/%v", *c.Ready, *c.Serving, *c.Terminating, tc.ready, tc.serving, tc.terminated)
			}
			if e.Zone != nil {
				t.Errorf("zone %q on a Node without a zone label", *e.Zone)
			}
			if e.TargetRef == nil || e.TargetRef.Kind != "Pod" || e.TargetRef.Name != "a-0" || e.TargetRef.UID != "a-0-uid" || e.TargetRef.ResourceVersion != "" {
				t.Errorf("targetRef %+v, want Pod a-0 with its uid and no resourceVersion", e.TargetRef)
			}
		})
	}
}

func TestHostnameNeedsSubdomainEqualToServiceName(t *testing.T) {
	for _, sub := range []string{"a", "other"} {
		fx := newFixture(t, 100)
		svc := newService("a")
		fx.add(svc, newNode("node-1", "z"), newPod("a", 0, func(p *corev1.Pod) { p.Spec.Hostname, p.Spec.Subdomain = "web-0", sub }))
		e := onlyEndpoint(t, fx.sync(svc).creates)
		if got := e.Hostname != nil && *e.Hostname == "web-0"; got != (sub == "a") {
			t.Errorf("subdomain %q: hostname %v", sub, e.Hostname)
		}
	}
}

func TestServicesWithoutManagedSlices(t *testing.T) {
	for name, svc := range map[string]*corev1.Service{
		"no selector": newService("a", func(s *corev1.Service) { s.Spec.Selector = nil }),
		"ExternalName with a selector": newService("a", func(s *corev1.Service) {
			s.Spec.Type, s.Spec.ExternalName = corev1.ServiceTypeExternalName, "example.com"
		}),
	} {
		fx := newFixture(t, 100)
		fx.add(svc, newNode("node-1", "z"))
		fx.add(newPods("a", 3)...)
		if w := fx.sync(svc); w.counts() != [3]int{} || w.err != nil {
			t.Errorf("%s: writes %v err %v, want none", name, w.counts(), w.err)
		}
	}
}

func TestMissingNodeIsRetriedButOtherWritesProceed(t *testing.T) {
	fx := newFixture(t, 100)
	svc := newService("a")
	fx.add(svc, newNode("node-1", "z"), newPod("a", 0), newPod("a", 1, onNode("late")))
	w := fx.sync(svc)
	if w.err == nil || len(w.creates) != 1 || len(w.creates[0].Endpoints) != 1 {
		t.Fatalf("err %v, created sizes %v; want an error (to retry) and the other pod published", w.err, sizes(w.creates))
	}
	if len(fx.events.Events) == 0 {
		t.Errorf("no event on the Service for the failed sync")
	}
	fx.add(newNode("late", "z"))
	if w := fx.sync(svc); w.err != nil || w.counts() != [3]int{0, 1, 0} || len(w.updates[0].Endpoints) != 2 {
		t.Errorf("after the Node appeared: writes %v err %v, want one update to 2 endpoints", w.counts(), w.err)
	}
}

// TestPacking covers upstream's write-minimising rules with exact counts.
func TestPacking(t *testing.T) {
	t.Run("leftovers that do not fit one slice get new slices, no rebalancing", func(t *testing.T) {
		fx, svc := packed(t, 74, 74)
		fx.add(newPods("a", 300)...)
		w := fx.sync(svc)
		if w.counts() != [3]int{2, 0, 0} || !slices.Equal(sizes(fx.slicesOf(svc)), []int{52, 74, 74, 100}) {
			t.Errorf("writes %v sizes %v; want 2 creates giving [52 74 74 100]", w.counts(), sizes(fx.slicesOf(svc)))
		}
	})
	t.Run("leftovers that fit go into the slice that ends fullest", func(t *testing.T) {
		fx, svc := packed(t, 62, 61)
		fx.add(newPods("a", 250)...)
		w := fx.sync(svc)
		if w.counts() != [3]int{1, 1, 0} || !slices.Equal(sizes(fx.slicesOf(svc)), []int{61, 89, 100}) {
			t.Errorf("writes %v sizes %v; want 1 create + 1 update giving [61 89 100]", w.counts(), sizes(fx.slicesOf(svc)))
		}
	})
	t.Run("a port change recycles deletes into updates", func(t *testing.T) {
		fx, svc := packed(t, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30)
		if w := fx.sync(svc); w.counts() != [3]int{} {
			t.Fatalf("unchanged slices were written: %v", w.counts())
		}
		svc = svc.DeepCopy()
		svc.Spec.Ports[0].TargetPort = intstrFromInt(81)
		fx.add(svc)
		w := fx.sync(svc)
		if w.err != nil {
			t.Fatal(w.err)
		}
		if w.counts() != [3]int{0, 3, 7} || !slices.Equal(sizes(fx.slicesOf(svc)), []int{100, 100, 100}) {
			t.Errorf("writes %v sizes %v; want 3 updates + 7 deletes giving [100 100 100]", w.counts(), sizes(fx.slicesOf(svc)))
		}
	})
	t.Run("the placeholder is updated in place when pods come and go", func(t *testing.T) {
		fx := newFixture(t, 100)
		svc := newService("a")
		fx.add(svc, newNode("node-1", "z"))
		if w := fx.sync(svc); w.counts() != [3]int{1, 0, 0} {
			t.Fatalf("placeholder: writes %v", w.counts())
		}
		name := fx.slicesOf(svc)[0].Name
		fx.add(newPods("a", 3)...)
		if w := fx.sync(svc); w.counts() != [3]int{0, 1, 0} || w.updates[0].Name != name {
			t.Fatalf("pods arrived: writes %v, want the placeholder %s updated", w.counts(), name)
		}
		for _, p := range newPods("a", 3) {
			fx.f.Core().V1().Pods().Informer().GetIndexer().Delete(p)
		}
		w := fx.sync(svc)
		if w.counts() != [3]int{0, 1, 0} || w.updates[0].Name != name || len(w.updates[0].Endpoints) != 0 {
			t.Errorf("pods left: writes %v err %v, want %s updated back to empty", w.counts(), w.err, name)
		}
	})
	t.Run("a changed endpoint updates only its slice", func(t *testing.T) {
		fx, svc := packed(t, 100, 100)
		fx.add(newPod("a", 7, notReady))
		if w := fx.sync(svc); w.counts() != [3]int{0, 1, 0} {
			t.Errorf("writes %v, want 1 update", w.counts())
		}
	})
}

// packed makes Service a with existing slices of the given sizes (pods
// a-0.. in order) in the cache, as if an earlier sync had written them.
func packed(t *testing.T, sizes ...int) (*fixture, *corev1.Service) {
	fx := newFixture(t, 100)
	svc := newService("a")
	fx.add(svc, newNode("node-1", "z"))
	next := 0
	for i, n := range sizes {
		seed := newFixture(t, 1000)
		seed.add(svc, newNode("node-1", "z"))
		seed.add(newPods("a", next+n)[next:]...)
		next += n
		s := seed.sync(svc).creates[0]
		s.Name, s.GenerateName = "a-seed-"+string(rune('a'+i)), ""
		fx.add(s)
		if err := fx.client.Tracker().Add(s); err != nil {
			t.Fatal(err)
		}
	}
	fx.add(newPods("a", next)...)
	return fx, svc
}

func TestSlicesOfAnOldServiceUIDAreReplaced(t *testing.T) {
	fx := newFixture(t, 100)
	old := newService("a")
	fx.add(old, newNode("node-1", "z"))
	fx.add(newPods("a", 2)...)
	fx.sync(old)
	recreated := old.DeepCopy()
	recreated.UID = "new-uid"
	fx.add(recreated)
	w := fx.sync(recreated)
	if w.counts() != [3]int{1, 0, 1} || w.creates[0].OwnerReferences[0].UID != "new-uid" {
		t.Errorf("writes %v, want 1 create (owned by the new UID) + 1 delete", w.counts())
	}
}

func TestForeignSlicesAreNeverTouched(t *testing.T) {
	fx := newFixture(t, 100)
	svc := newService("a")
	fx.add(svc, newNode("node-1", "z"))
	foreign := &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "mine", Namespace: "ns", Labels: map[string]string{
			discovery.LabelServiceName: "a", discovery.LabelManagedBy: "someone-else"}},
		AddressType: discovery.AddressTypeIPv4,
	}
	fx.add(foreign)
	w := fx.sync(svc)
	if w.counts() != [3]int{1, 0, 0} {
		t.Errorf("writes %v, want only our placeholder created", w.counts())
	}
}

func TestStaleCacheIsRetriedNotActedOn(t *testing.T) {
	fx := newFixture(t, 100)
	svc := newService("a")
	fx.add(svc, newNode("node-1", "z"))
	fx.add(newPods("a", 2)...)
	created := fx.sync(svc).creates[0]
	// The tracker now expects generation 1; make the cache show an older one.
	stale := created.DeepCopy()
	stale.Generation = 0
	fx.f.Discovery().V1().EndpointSlices().Informer().GetIndexer().Update(stale)
	fx.add(newPod("a", 2))
	if w := fx.sync(svc); !errors.Is(w.err, kit.ErrStaleCache) || w.counts() != [3]int{} {
		t.Errorf("on a stale cache: err %v writes %v; want ErrStaleCache and no writes", w.err, w.counts())
	}
}

func TestTrafficDistributionRemovedDropsHints(t *testing.T) {
	fx := newFixture(t, 100)
	svc := newService("a", withTrafficDistribution(corev1.ServiceTrafficDistributionPreferClose))
	fx.add(svc, newNode("node-1", "z"))
	fx.add(newPods("a", 2)...)
	fx.sync(svc)
	plain := newService("a")
	fx.add(plain)
	w := fx.sync(plain)
	if w.counts() != [3]int{0, 1, 0} {
		t.Fatalf("writes %v, want 1 update", w.counts())
	}
	for _, e := range w.updates[0].Endpoints {
		if e.Hints != nil {
			t.Errorf("hints %+v left after trafficDistribution was removed", e.Hints)
		}
	}
}

func TestMetrics(t *testing.T) {
	fx := newFixture(t, 100)
	reg := prometheus.NewRegistry()
	c, err := New(logrDiscard(), fx.client, sourcesOf(fx.f), fx.events, reg, Options{MaxEndpointsPerSlice: 100})
	if err != nil {
		t.Fatal(err)
	}
	fx.c = c
	svc := newService("a", dualStack)
	fx.add(svc, newNode("node-1", "z"))
	fx.add(newPods("a", 3)...)
	fx.sync(svc)
	fx.c.metrics.ObserveSync(nil)
	want := map[string]float64{
		`netplane_endpointslice_changes_total{operation="create"}`: 2,
		`netplane_endpointslice_desired_endpoints`:                 6,
		`netplane_endpointslice_slices`:                            2,
		`netplane_endpointslice_syncs_total{result="success"}`:     1,
	}
	got := gather(t, reg)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v (all: %v)", k, got[k], v, got)
		}
	}
}

// gather flattens a registry into "name{label="value"}" → value.
func gather(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			name := f.GetName()
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			if len(labels) > 0 {
				name += "{" + strings.Join(labels, ",") + "}"
			}
			switch {
			case m.GetCounter() != nil:
				out[name] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				out[name] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}

// TestTopologyModeAutoHints: the annotation-driven hints, fed by the Node
// topology worker, spread zones in proportion to their CPUs.
func TestTopologyModeAutoHints(t *testing.T) {
	fx := newFixture(t, 100)
	svc := newService("a", func(s *corev1.Service) {
		s.Annotations = map[string]string{corev1.AnnotationTopologyMode: "Auto"}
	})
	fx.add(svc)
	for i, zone := range []string{"z1", "z2", "z3"} {
		n := newNode(fmt.Sprintf("node-%d", i+1), zone)
		n.Status.Allocatable = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4")}
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
		fx.add(n)
	}
	for i := range 9 {
		fx.add(newPod("a", i, onNode(fmt.Sprintf("node-%d", i%3+1))))
	}
	fx.c.topologyQueue.Add(topologyKey)
	done := make(chan struct{})
	go func() { fx.c.topologyWorker(t.Context()); close(done) }()
	framework.EventuallyEvery(t, time.Millisecond, 10*time.Second, "the topology worker to take its key", func() error {
		if n := fx.c.topologyQueue.Len(); n != 0 {
			return fmt.Errorf("%d keys queued", n)
		}
		return nil
	})
	fx.c.topologyQueue.Renew()
	<-done
	w := fx.sync(svc)
	if len(w.creates) != 1 {
		t.Fatalf("writes %v", w.counts())
	}
	for _, e := range w.creates[0].Endpoints {
		if e.Hints == nil || len(e.Hints.ForZones) != 1 || e.Hints.ForZones[0].Name != *e.Zone {
			t.Errorf("endpoint in %s has hints %+v, want its own zone", *e.Zone, e.Hints)
		}
	}
}
