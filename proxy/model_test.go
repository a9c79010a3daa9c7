package proxy

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/netplane/netplane/nodeview"
)

// TestIncrementalModelEqualsAFreshBuild changes Services and slices at
// random and checks, after every step, that the cached model's tables are
// exactly what a fresh build gives.
// The model kept by Apply, told only the Services each step changed (as a
// partial sync is), must equal it too.
func TestIncrementalModelEqualsAFreshBuild(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	in := overall()
	m, ma := NewModel(), NewModel()
	ma.Build(in)
	keys := func() []types.NamespacedName {
		var ks []types.NamespacedName
		for _, s := range in.Services {
			ks = append(ks, s.key())
		}
		return ks
	}
	var deleted []*serviceRecord
	for step := 0; step < 300; step++ {
		ks := keys()
		k := ks[rng.IntN(len(ks))]
		changed := []types.NamespacedName{k}
		switch rng.IntN(4) {
		case 0: // move an endpoint to a shared address
			if ss := in.Slices[k]; len(ss) > 0 {
				s := *ss[0]
				s.endpoints = slices.Clone(s.endpoints)
				if len(s.endpoints) > 0 {
					s.endpoints[rng.IntN(len(s.endpoints))].addr = netip.MustParseAddr(fmt.Sprintf("10.180.0.%d", 1+rng.IntN(3)))
				}
				in.Slices[k] = append([]*sliceRecord{&s}, ss[1:]...)
			}
		case 1: // drop all slices
			delete(in.Slices, k)
		case 2: // delete a Service, or bring a deleted one back
			if len(deleted) > 0 && (len(in.Services) < 4 || rng.IntN(2) == 0) {
				c := *deleted[0]
				in.Services = append(slices.Clone(in.Services), &c)
				deleted = deleted[1:]
				changed = []types.NamespacedName{c.key()}
				break
			}
			for i, s := range in.Services {
				if s.key() == k {
					in.Services = slices.Delete(slices.Clone(in.Services), i, i+1)
					deleted = append(deleted, s)
					break
				}
			}
		case 3: // a new pointer with the same content
			for i, s := range in.Services {
				if s.key() == k {
					c := *s
					in.Services = slices.Clone(in.Services)
					in.Services[i] = &c
				}
			}
		}
		got := m.Build(in)
		want := Build(in)
		delta := map[types.NamespacedName]Change{}
		for _, name := range changed {
			c := Change{Slices: in.Slices[name]}
			for _, s := range in.Services {
				if s.key() == name {
					c.Svc = s
				}
			}
			delta[name] = c
		}
		applied := ma.Apply(delta)
		for _, fam := range []nodeview.Family{nodeview.IPv4, nodeview.IPv6} {
			if diff := cmp.Diff(want.Tables[fam].Dump(), got.Tables[fam].Dump()); diff != "" {
				t.Fatalf("step %d: incremental model differs from a fresh build (-fresh +incremental):\n%s", step, diff)
			}
			if diff := cmp.Diff(want.Tables[fam].Dump(), applied.Tables[fam].Dump()); diff != "" {
				t.Fatalf("step %d: model told the changes differs from a fresh build (-fresh +applied):\n%s", step, diff)
			}
		}
		if diff := cmp.Diff(summariesOf(want), summariesOf(applied)); diff != "" {
			t.Fatalf("step %d: summaries differ (-fresh +applied):\n%s", step, diff)
		}
	}
}

// summariesOf is what a Desired says besides its tables.
func summariesOf(d *Desired) any {
	return struct {
		Health  map[types.NamespacedName]HealthInfo
		UDP     map[netip.AddrPort]map[netip.AddrPort]bool
		NoLocal [2]int
	}{d.Health, d.UDP, [2]int{d.NoLocalInternal, d.NoLocalExternal}}
}

// TestSummariesFollowEachChangeAndLeaveHandedOutMapsAlone: two UDP
// Services share an external IP and port, one with a health check; each
// step's summaries equal a fresh build's, and the maps an earlier step
// handed out (which the health servers and the conntrack cleaner keep)
// are as they were when handed out.
func TestSummariesFollowEachChangeAndLeaveHandedOutMapsAlone(t *testing.T) {
	udpSvc := func(name, port string, local bool) []any {
		return []any{svc("ns", name, func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeLoadBalancer
			s.Spec.ClusterIP = "172.30.1." + port
			s.Spec.ExternalIPs = []string{"192.168.99.53"}
			s.Spec.Ports = []v1.ServicePort{{Name: "dns", Protocol: v1.ProtocolUDP, Port: 53, NodePort: 30000 + int32(len(name))}}
			if local {
				s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
				s.Spec.HealthCheckNodePort = 31000
			}
		}), slice("ns/"+name, name+"-a", map[string]int32{"dns": 53}, v1.ProtocolUDP, ep{ip: "10.180.0." + port, node: "node-a"})}
	}
	a, b, b2 := udpSvc("a", "1", false), udpSvc("bb", "2", true), udpSvc("bb", "3", false)
	steps := []struct {
		name string
		objs []any
	}{
		{"a", a},
		{"a and b share the external address", append(slices.Clone(a), b...)},
		{"b moves its endpoint and drops its health check", append(slices.Clone(a), b2...)},
		{"a goes", b2},
		{"nothing", nil},
	}
	m := NewModel()
	type handed struct {
		d    *Desired
		want any
	}
	var before []handed
	for _, st := range steps {
		in := input(testNode, st.objs...)
		delta := map[types.NamespacedName]Change{}
		for _, k := range []types.NamespacedName{nsName("ns", "a"), nsName("ns", "bb")} {
			c := Change{Slices: in.Slices[k]}
			for _, s := range in.Services {
				if s.key() == k {
					c.Svc = s
				}
			}
			delta[k] = c
		}
		var got *Desired
		if len(before) == 0 {
			got = m.Build(in)
		} else {
			got = m.Apply(delta)
		}
		if diff := cmp.Diff(summariesOf(Build(in)), summariesOf(got)); diff != "" {
			t.Fatalf("%s: summaries differ from a fresh build (-fresh +applied):\n%s", st.name, diff)
		}
		if diff := cmp.Diff(summariesFromFragments(m), summariesOf(got)); diff != "" {
			t.Fatalf("%s: summaries differ from the fragments' (-fragments +applied):\n%s", st.name, diff)
		}
		for i, h := range before {
			if diff := cmp.Diff(h.want, summariesOf(h.d)); diff != "" {
				t.Fatalf("%s: the summaries handed out at step %d changed:\n%s", st.name, i, diff)
			}
		}
		before = append(before, handed{&Desired{Health: got.Health, UDP: got.UDP}, summariesOf(&Desired{Health: maps.Clone(got.Health), UDP: cloneUDP(got.UDP)})})
	}
}

// summariesFromFragments sums every fragment's summaries, as the model
// did on every sync before it kept them up to date.
func summariesFromFragments(m *Model) any {
	d := &Desired{Health: map[types.NamespacedName]HealthInfo{}, UDP: map[netip.AddrPort]map[netip.AddrPort]bool{}}
	for _, f := range m.frags {
		maps.Copy(d.Health, f.d.Health)
		for vip, eps := range f.d.UDP {
			if d.UDP[vip] == nil {
				d.UDP[vip] = map[netip.AddrPort]bool{}
			}
			maps.Copy(d.UDP[vip], eps)
		}
		d.NoLocalInternal += f.d.NoLocalInternal
		d.NoLocalExternal += f.d.NoLocalExternal
	}
	return summariesOf(d)
}

func cloneUDP(u map[netip.AddrPort]map[netip.AddrPort]bool) map[netip.AddrPort]map[netip.AddrPort]bool {
	out := make(map[netip.AddrPort]map[netip.AddrPort]bool, len(u))
	for k, v := range u {
		out[k] = maps.Clone(v)
	}
	return out
}

// TestParallelBuildEqualsASequentialOne: at start-up fragments are built on
// all CPUs; the merged tables must not depend on it.
func TestParallelBuildEqualsASequentialOne(t *testing.T) {
	in := scaleInput(1200)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4)) // parallel on any machine
	parallel := Build(in)
	defer func(n int) { parallelFrom = n }(parallelFrom)
	parallelFrom = 1 << 30
	sequential := Build(in)
	for _, fam := range nodeview.Families {
		if diff := cmp.Diff(sequential.Tables[fam].Dump(), parallel.Tables[fam].Dump()); diff != "" {
			t.Fatalf("parallel build differs (-sequential +parallel):\n%s", diff)
		}
	}
}
