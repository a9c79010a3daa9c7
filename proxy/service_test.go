package proxy

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"

	"github.com/netplane/netplane/nodeview"
)

func TestEndpointsAreMappedByPortNamePerSliceAndMergedWhenDuplicated(t *testing.T) {
	s := svc("ns", "s", func(s *v1.Service) {
		s.Spec.ClusterIP = "172.30.0.1"
		s.Spec.Ports = []v1.ServicePort{tcp("http", 80), tcp("admin", 81)}
	})
	slices := []*discovery.EndpointSlice{
		// The same port name has a different number in each slice.
		slice("ns/s", "a", map[string]int32{"http": 8080, "admin": 9090}, v1.ProtocolTCP, ep{ip: "10.0.0.1", notReady: true}, ep{ip: "10.0.0.2"}),
		slice("ns/s", "b", map[string]int32{"http": 8081}, v1.ProtocolTCP, ep{ip: "10.0.0.3"}),
		// A duplicate of 10.0.0.1:8080, ready this time: the ready copy wins.
		slice("ns/s", "c", map[string]int32{"http": 8080}, v1.ProtocolTCP, ep{ip: "10.0.0.1", node: "node-a"}),
		// A UDP port of the same name does not match a TCP service port.
		slice("ns/s", "d", map[string]int32{"http": 53}, v1.ProtocolUDP, ep{ip: "10.0.0.4"}),
	}
	var records []*sliceRecord
	for _, s := range slices {
		records = append(records, sliceRecordOf(s))
	}
	sps := servicePorts(s)
	got := map[string][]string{}
	for _, sp := range sps {
		for _, e := range endpointsFor(&sp, records, "node-a") {
			got[sp.Name] = append(got[sp.Name], fmt.Sprintf("%s ready=%v local=%v", e.addrPort(), e.Ready, e.Local))
		}
	}
	want := map[string][]string{
		"http":  {"10.0.0.1:8080 ready=true local=true", "10.0.0.2:8080 ready=true local=false", "10.0.0.3:8081 ready=true local=false"},
		"admin": {"10.0.0.1:9090 ready=false local=false", "10.0.0.2:9090 ready=true local=false"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("endpoints (-want +got):\n%s", diff)
	}
}

func TestServicePortsSkipHeadlessExternalNameAndProxyModeIngress(t *testing.T) {
	lb := svc("ns", "lb", func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeLoadBalancer
		s.Spec.ClusterIP = "172.30.0.2"
		s.Spec.Ports = []v1.ServicePort{{Name: "p", Protocol: v1.ProtocolTCP, Port: 80, NodePort: 30080}}
		s.Spec.ExternalIPs = []string{"010.001.002.003"} // leading zeros, as old API servers stored them
		s.Spec.LoadBalancerSourceRanges = []string{" 203.0.113.0/25 ", "bogus"}
		s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{
			{IP: "1.2.3.4"}, {IP: "5.6.7.8", IPMode: ptr.To(v1.LoadBalancerIPModeVIP)}, {IP: "9.9.9.9", IPMode: ptr.To(v1.LoadBalancerIPModeProxy)}, {Hostname: "lb.example"}}
	})
	sps := servicePorts(lb)
	if len(sps) != 1 {
		t.Fatalf("got %d ports, want 1", len(sps))
	}
	sp := sps[0]
	if want := []netip.Addr{netip.MustParseAddr("1.2.3.4"), netip.MustParseAddr("5.6.7.8")}; !slices.Equal(sp.LoadBalancer, want) {
		t.Errorf("load-balancer IPs %v, want %v (ipMode Proxy gets no rules)", sp.LoadBalancer, want)
	}
	if want := []netip.Addr{netip.MustParseAddr("10.1.2.3")}; !slices.Equal(sp.ExternalIPs, want) {
		t.Errorf("externalIPs %v, want %v", sp.ExternalIPs, want)
	}
	if want := []netip.Prefix{netip.MustParsePrefix("203.0.113.0/25")}; !slices.Equal(sp.SourceRanges, want) {
		t.Errorf("source ranges %v, want %v", sp.SourceRanges, want)
	}
	if sp.NodePort != 30080 || sp.Affinity != 0 {
		t.Errorf("nodePort %d affinity %v", sp.NodePort, sp.Affinity)
	}
	for _, s := range []*v1.Service{
		svc("ns", "headless", func(s *v1.Service) { s.Spec.ClusterIP = v1.ClusterIPNone; s.Spec.Ports = []v1.ServicePort{tcp("", 80)} }),
		svc("ns", "name", func(s *v1.Service) { s.Spec.Type = v1.ServiceTypeExternalName }),
	} {
		if got := servicePorts(s); len(got) != 0 {
			t.Errorf("%s: got %d ports, want none", s.Name, len(got))
		}
	}
	aff := svc("ns", "aff", func(s *v1.Service) {
		s.Spec.ClusterIP = "172.30.0.3"
		s.Spec.Ports = []v1.ServicePort{tcp("", 80)}
		s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
	})
	if got := servicePorts(aff)[0].Affinity; got != defaultAffinityTimeout {
		t.Errorf("default affinity timeout %v, want %v", got, defaultAffinityTimeout)
	}
}

func TestCategorizeEndpoints(t *testing.T) {
	local := func(ip string, mods ...func(*endpoint)) endpoint {
		e := endpoint{Addr: netip.MustParseAddr(ip), Port: 80, Ready: true, Serving: true, Local: true}
		for _, m := range mods {
			m(&e)
		}
		return e
	}
	remote := func(ip string, mods ...func(*endpoint)) endpoint {
		e := local(ip, mods...)
		e.Local = false
		return e
	}
	terminating := func(e *endpoint) { e.Ready, e.Terminating = false, true }
	zone := func(z string) func(*endpoint) { return func(e *endpoint) { e.ZoneHints = append(e.ZoneHints, z) } }
	node := func(n string) func(*endpoint) { return func(e *endpoint) { e.NodeHints = append(e.NodeHints, n) } }
	cluster := &servicePort{NodePort: 30000}
	etpLocal := &servicePort{NodePort: 30000, ExternalLocal: true}
	itpLocal := &servicePort{InternalLocal: true}
	cases := []struct {
		name         string
		sp           *servicePort
		eps          []endpoint
		cluster, loc []string
		any          bool
	}{
		{"ready endpoints only", cluster, []endpoint{local("10.0.0.1"), remote("10.0.0.2", terminating)}, []string{"10.0.0.1"}, nil, true},
		{"terminating fallback when none is ready", cluster, []endpoint{remote("10.0.0.2", terminating)}, []string{"10.0.0.2"}, nil, true},
		{"nothing usable", cluster, []endpoint{remote("10.0.0.2", func(e *endpoint) { e.Ready, e.Serving = false, false })}, nil, nil, false},
		{"zone hints narrow the choice", cluster, []endpoint{remote("10.0.0.1", zone("z1")), remote("10.0.0.2", zone("z2"))}, []string{"10.0.0.1"}, nil, true},
		{"node hints win over zone hints", cluster, []endpoint{remote("10.0.0.1", zone("z1"), node("node-b")), remote("10.0.0.2", zone("z1"), node("node-a"))}, []string{"10.0.0.2"}, nil, true},
		{"hints ignored when one ready endpoint lacks them", cluster, []endpoint{remote("10.0.0.1", zone("z2")), remote("10.0.0.2")}, []string{"10.0.0.1", "10.0.0.2"}, nil, true},
		{"hints ignored when none is for this zone", cluster, []endpoint{remote("10.0.0.1", zone("z2")), remote("10.0.0.2", zone("z3"))}, []string{"10.0.0.1", "10.0.0.2"}, nil, true},
		{"node hints ignored unless every ready endpoint has one: zone hints apply", cluster, []endpoint{remote("10.0.0.1", zone("z1"), node("node-a")), remote("10.0.0.2", zone("z1")), remote("10.0.0.3", zone("z2"))}, []string{"10.0.0.1", "10.0.0.2"}, nil, true},
		{"node hints for other nodes only: zone hints apply", cluster, []endpoint{remote("10.0.0.1", zone("z1"), node("node-b")), remote("10.0.0.2", zone("z2"), node("node-c"))}, []string{"10.0.0.1"}, nil, true},
		{"node hints without zone hints", cluster, []endpoint{remote("10.0.0.1", node("node-a")), remote("10.0.0.2", node("node-b"))}, []string{"10.0.0.1"}, nil, true},
		{"mixed hint kinds are ignored", cluster, []endpoint{remote("10.0.0.1", node("node-a")), remote("10.0.0.2", zone("z1"))}, []string{"10.0.0.1", "10.0.0.2"}, nil, true},
		{"a not-ready endpoint without hints does not matter", cluster, []endpoint{remote("10.0.0.1", zone("z1")), remote("10.0.0.2", zone("z2")), remote("10.0.0.3", func(e *endpoint) { e.Ready = false })}, []string{"10.0.0.1"}, nil, true},
		{"terminating fallback ignores hints", cluster, []endpoint{remote("10.0.0.1", terminating, zone("z2")), remote("10.0.0.2", terminating, zone("z3"))}, []string{"10.0.0.1", "10.0.0.2"}, nil, true},
		{"eTP Local: local ready endpoints", etpLocal, []endpoint{local("10.0.0.1"), remote("10.0.0.2")}, []string{"10.0.0.1", "10.0.0.2"}, []string{"10.0.0.1"}, true},
		{"eTP Local: local terminating fallback", etpLocal, []endpoint{local("10.0.0.1", terminating), remote("10.0.0.2")}, []string{"10.0.0.2"}, []string{"10.0.0.1"}, true},
		{"iTP Local: no local endpoint", itpLocal, []endpoint{remote("10.0.0.2")}, nil, nil, true},
	}
	addrs := func(eps []endpoint) []string {
		var out []string
		for _, e := range eps {
			out = append(out, e.Addr.String())
		}
		return out
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := categorize(c.sp, c.eps, "node-a", "z1")
			if !slices.Equal(addrs(got.Cluster), c.cluster) || !slices.Equal(addrs(got.Local), c.loc) || got.Any != c.any {
				t.Errorf("got cluster %v local %v any %v; want %v %v %v", addrs(got.Cluster), addrs(got.Local), got.Any, c.cluster, c.loc, c.any)
			}
		})
	}
}

func TestStaleUDPFlows(t *testing.T) {
	vip := netip.MustParseAddrPort("172.30.0.10:53")
	gone := netip.MustParseAddrPort("172.30.0.11:53")
	a, b := netip.MustParseAddrPort("10.0.0.1:5353"), netip.MustParseAddrPort("10.0.0.2:5353")
	before := map[netip.AddrPort]map[netip.AddrPort]bool{vip: {a: true, b: true}, gone: {a: true}}
	now := map[netip.AddrPort]map[netip.AddrPort]bool{vip: {b: true}}
	s := staleUDP{now: now, before: before}
	cases := []struct {
		dst   netip.AddrPort
		reply netip.AddrPort
		stale bool
	}{
		{vip, b, false},  // a current endpoint
		{vip, a, true},   // an endpoint that went away
		{vip, vip, true}, // no DNAT: sent while there were no endpoints
		{vip, netip.AddrPortFrom(b.Addr(), 53), true}, // the endpoint's old target port
		{gone, a, true}, // the Service went away
		{netip.MustParseAddrPort("10.9.9.9:53"), a, false}, // not a Service: never touched
	}
	for _, c := range cases {
		if got := s.stale(c.dst, c.reply); got != c.stale {
			t.Errorf("flow to %s answered by %s: stale=%v, want %v", c.dst, c.reply, got, c.stale)
		}
	}
	if udpChanged(now, map[netip.AddrPort]map[netip.AddrPort]bool{vip: {b: true}}) {
		t.Error("equal maps reported as changed")
	}
}

func TestNodePortAddresses(t *testing.T) {
	node := &v1.Node{Status: v1.NodeStatus{Addresses: []v1.NodeAddress{
		{Type: v1.NodeHostName, Address: "node-a"},
		{Type: v1.NodeExternalIP, Address: "198.51.100.7"},
		{Type: v1.NodeInternalIP, Address: "192.168.0.2"},
		{Type: v1.NodeInternalIP, Address: "192.168.0.9"},
		{Type: v1.NodeExternalIP, Address: "2001:db8::1"},
	}}}
	local := func() []netip.Addr {
		return []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("192.168.0.2"), netip.MustParseAddr("10.1.0.1"), netip.MustParseAddr("fd00::5")}
	}
	cases := []struct {
		spec []string
		want []string
	}{
		{nil, []string{"192.168.0.2", "2001:db8::1"}},
		{[]string{"primary"}, []string{"192.168.0.2", "2001:db8::1"}},
		{[]string{"10.0.0.0/8", "127.0.0.0/8", "fd00::/64"}, []string{"10.1.0.1", "fd00::5"}},
	}
	for _, c := range cases {
		var got []string
		for _, a := range nodePortIPs(c.spec, nodeview.Of(node, nodeview.Keep{}).PrimaryIPs(), local) {
			got = append(got, a.String())
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("--nodeport-addresses=%v: got %v, want %v", c.spec, got, c.want)
		}
	}
}

// TestUDPFlowsKeepTheirEndpointWhileItServes: the conntrack cleaner's view
// of a UDP Service keeps every endpoint that serves, a terminating one
// among them (a DNS server in its lameduck answers what it was sent),
// whether or not new flows are still sent to it.
func TestUDPFlowsKeepTheirEndpointWhileItServes(t *testing.T) {
	vip := netip.MustParseAddrPort("172.30.0.10:53")
	dns := svc("kube-system", "kube-dns", func(s *v1.Service) {
		s.Spec.ClusterIP = vip.Addr().String()
		s.Spec.Ports = []v1.ServicePort{{Name: "dns", Protocol: v1.ProtocolUDP, Port: 53}}
	})
	cases := []struct {
		name string
		eps  []ep
		keep []string
	}{
		{"ready", []ep{{ip: "10.0.0.1"}, {ip: "10.0.0.2"}}, []string{"10.0.0.1:53", "10.0.0.2:53"}},
		{"one terminating, still serving", []ep{{ip: "10.0.0.1"}, {ip: "10.0.0.2", notReady: true, serving: true, termin: true}}, []string{"10.0.0.1:53", "10.0.0.2:53"}},
		{"one terminating, no longer serving", []ep{{ip: "10.0.0.1"}, {ip: "10.0.0.2", notReady: true, termin: true}}, []string{"10.0.0.1:53"}},
		{"one not ready", []ep{{ip: "10.0.0.1"}, {ip: "10.0.0.2", notReady: true}}, []string{"10.0.0.1:53"}},
	}
	for _, c := range cases {
		d := Build(input(testNode, dns, slice("kube-system/kube-dns", "s1", map[string]int32{"dns": 53}, v1.ProtocolUDP, c.eps...)))
		var got []string
		for e := range d.UDP[vip] {
			got = append(got, e.String())
		}
		slices.Sort(got)
		if !slices.Equal(got, c.keep) {
			t.Errorf("%s: UDP flows to %s kept for %v, want %v", c.name, vip, got, c.keep)
		}
	}
}
