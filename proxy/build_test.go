package proxy

import (
	"encoding/binary"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/netplane/netplane/nft"
	"github.com/netplane/netplane/nodeview"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// Fixture conventions follow kube-proxy's tests: pods 10.0.0.0/8, ClusterIPs
// 172.30.0.0/16, node 192.168.0.2 (this node is "node-a" in zone "z1").
var testNode = NodeFacts{
	Name:         "node-a",
	Zone:         "z1",
	ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00:10::/64")},
	ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("172.30.0.0/16"), netip.MustParsePrefix("fd00:10:96::/112")},
	NodePortIPs:  []netip.Addr{netip.MustParseAddr("192.168.0.2"), netip.MustParseAddr("2001:db8::1")},
	PodCIDRs:     []netip.Prefix{netip.MustParsePrefix("10.180.0.0/24"), netip.MustParsePrefix("fd00:10:180::/64")},
}

func svc(ns, name string, mut func(*v1.Service)) *v1.Service {
	s := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       v1.ServiceSpec{Type: v1.ServiceTypeClusterIP},
	}
	mut(s)
	if s.Spec.ClusterIP != "" && len(s.Spec.ClusterIPs) == 0 {
		s.Spec.ClusterIPs = []string{s.Spec.ClusterIP}
	}
	return s
}

func tcp(name string, p int32) v1.ServicePort {
	return v1.ServicePort{Name: name, Protocol: v1.ProtocolTCP, Port: p}
}

type ep struct {
	ip                        string
	node                      string
	notReady, serving, termin bool
	zones                     []string
}

func slice(svcName, name string, ports map[string]int32, proto v1.Protocol, eps ...ep) *discovery.EndpointSlice {
	ns, n, _ := strings.Cut(svcName, "/")
	at := discovery.AddressTypeIPv4
	if strings.Contains(eps[0].ip, ":") {
		at = discovery.AddressTypeIPv6
	}
	s := &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{discovery.LabelServiceName: n}},
		AddressType: at,
	}
	for pn, p := range ports {
		s.Ports = append(s.Ports, discovery.EndpointPort{Name: ptr.To(pn), Port: ptr.To(p), Protocol: ptr.To(proto)})
	}
	for _, e := range eps {
		de := discovery.Endpoint{Addresses: []string{e.ip}, Conditions: discovery.EndpointConditions{
			Ready: ptr.To(!e.notReady), Serving: ptr.To(!e.notReady || e.serving), Terminating: ptr.To(e.termin)}}
		if e.node != "" {
			de.NodeName = ptr.To(e.node)
		}
		if len(e.zones) > 0 {
			de.Hints = &discovery.EndpointHints{}
			for _, z := range e.zones {
				de.Hints.ForZones = append(de.Hints.ForZones, discovery.ForZone{Name: z})
			}
		}
		s.Endpoints = append(s.Endpoints, de)
	}
	return s
}

// input is the model's input for API objects, as the informers record them.
func input(node NodeFacts, objs ...any) Input {
	in := Input{Slices: map[types.NamespacedName][]*sliceRecord{}, Node: node}
	for _, o := range objs {
		switch o := o.(type) {
		case *v1.Service:
			in.Services = append(in.Services, serviceRecordOf(o))
		case *discovery.EndpointSlice:
			k := types.NamespacedName{Namespace: o.Namespace, Name: o.Labels[discovery.LabelServiceName]}
			in.Slices[k] = append(in.Slices[k], sliceRecordOf(o))
		}
	}
	return in
}

// withEndpoint is a copy of s with one more ready endpoint at ip.
func withEndpoint(s *sliceRecord, ip string) *sliceRecord {
	c := *s
	c.endpoints = append(slices.Clone(s.endpoints), sliceEndpoint{addr: netip.MustParseAddr(ip), ready: true, serving: true})
	return &c
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./proxy -run %s -update to create it)", err, t.Name())
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("%s differs from the desired ruleset (-want +got):\n%s", path, diff)
	}
}

// overall is one of each kind of Service, as kube-proxy's
// TestOverallNFTablesRules: the golden dump documents the whole layout.
func overall() Input {
	return input(testNode,
		// A plain ClusterIP with two endpoints, one here and one elsewhere.
		svc("ns1", "svc1", func(s *v1.Service) {
			s.Spec.ClusterIP = "172.30.0.41"
			s.Spec.Ports = []v1.ServicePort{tcp("p80", 80)}
		}),
		slice("ns1/svc1", "svc1-a", map[string]int32{"p80": 8080}, v1.ProtocolTCP, ep{ip: "10.180.0.1", node: "node-a"}, ep{ip: "10.180.1.1", node: "node-b"}),
		// LoadBalancer, externalTrafficPolicy Local, externalIP, healthCheckNodePort.
		svc("ns2", "svc2", func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeLoadBalancer
			s.Spec.ClusterIP = "172.30.0.42"
			s.Spec.ExternalIPs = []string{"192.168.99.22"}
			s.Spec.Ports = []v1.ServicePort{{Name: "p80", Protocol: v1.ProtocolTCP, Port: 80, NodePort: 3001}}
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			s.Spec.HealthCheckNodePort = 30000
			s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "1.2.3.4"}, {IP: "5.6.7.8", IPMode: ptr.To(v1.LoadBalancerIPModeProxy)}}
		}),
		slice("ns2/svc2", "svc2-a", map[string]int32{"p80": 80}, v1.ProtocolTCP, ep{ip: "10.180.0.2", node: "node-a"}, ep{ip: "10.180.1.2", node: "node-b"}),
		// NodePort, UDP, two ports, one of them SCTP.
		svc("ns3", "svc3", func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeNodePort
			s.Spec.ClusterIP = "172.30.0.43"
			s.Spec.Ports = []v1.ServicePort{{Name: "dns", Protocol: v1.ProtocolUDP, Port: 53, NodePort: 3003}, {Name: "sctp", Protocol: v1.ProtocolSCTP, Port: 9, NodePort: 3004}}
		}),
		slice("ns3/svc3", "svc3-a", map[string]int32{"dns": 5353}, v1.ProtocolUDP, ep{ip: "10.180.0.3", node: "node-a"}),
		slice("ns3/svc3", "svc3-b", map[string]int32{"sctp": 9999}, v1.ProtocolSCTP, ep{ip: "10.180.0.3", node: "node-a"}),
		// LoadBalancer with source ranges and ClientIP affinity.
		svc("ns5", "svc5", func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeLoadBalancer
			s.Spec.ClusterIP = "172.30.0.45"
			s.Spec.Ports = []v1.ServicePort{{Name: "p80", Protocol: v1.ProtocolTCP, Port: 80, NodePort: 3002}}
			s.Spec.LoadBalancerSourceRanges = []string{" 203.0.113.0/25", "203.0.113.64/26"}
			s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](10)}}
			s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "5.6.7.8"}}
		}),
		slice("ns5/svc5", "svc5-a", map[string]int32{"p80": 80}, v1.ProtocolTCP, ep{ip: "10.180.0.5", node: "node-a"}, ep{ip: "10.180.1.5", node: "node-b"}),
		// No endpoints: rejected.
		svc("ns6", "svc6", func(s *v1.Service) {
			s.Spec.ClusterIP = "172.30.0.46"
			s.Spec.Ports = []v1.ServicePort{tcp("", 80)}
		}),
		// Dual-stack, internalTrafficPolicy Local with only a remote endpoint: dropped.
		svc("ns7", "svc7", func(s *v1.Service) {
			s.Spec.ClusterIPs = []string{"172.30.0.47", "fd00:10:96::47"}
			s.Spec.ClusterIP = "172.30.0.47"
			s.Spec.Ports = []v1.ServicePort{tcp("", 80)}
			s.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyLocal)
		}),
		slice("ns7/svc7", "svc7-a", map[string]int32{"": 80}, v1.ProtocolTCP, ep{ip: "10.180.1.7", node: "node-b"}),
		slice("ns7/svc7", "svc7-b", map[string]int32{"": 80}, v1.ProtocolTCP, ep{ip: "fd00:10:180::7", node: "node-b"}),
		// Headless and ExternalName Services get no rules.
		svc("ns8", "headless", func(s *v1.Service) { s.Spec.ClusterIP = v1.ClusterIPNone; s.Spec.Ports = []v1.ServicePort{tcp("", 80)} }),
		svc("ns8", "external", func(s *v1.Service) { s.Spec.Type = v1.ServiceTypeExternalName; s.Spec.ExternalName = "example.com" }),
	)
}

func TestOverallRulesetMatchesGoldenDump(t *testing.T) {
	d := Build(overall())
	golden(t, "overall-ip.nft", d.Tables[nodeview.IPv4].Dump())
	golden(t, "overall-ip6.nft", d.Tables[nodeview.IPv6].Dump())
	want := map[types.NamespacedName]HealthInfo{{Namespace: "ns2", Name: "svc2"}: {Port: 30000, LocalEndpoints: 1}}
	if diff := cmp.Diff(want, d.Health); diff != "" {
		t.Errorf("health-check node ports (-want +got):\n%s", diff)
	}
	if d.NoLocalInternal != 1 || d.NoLocalExternal != 0 {
		t.Errorf("no-local-endpoint counts: got internal %d external %d, want 1 and 0", d.NoLocalInternal, d.NoLocalExternal)
	}
}

func TestMasqueradeAllGolden(t *testing.T) {
	n := testNode
	n.MasqueradeAll = true
	n.ClusterCIDRs = nil
	in := overall()
	in.Node = n
	golden(t, "masquerade-all-ip.nft", Build(in).Tables[nodeview.IPv4].Dump())
}

// kube-proxy's local detector takes a list: a pod in any cluster CIDR is
// "inside", for the ClusterIP masquerade and the Local-policy short-cut.
func TestMasqueradeDecisionUsesEveryClusterCIDR(t *testing.T) {
	n := testNode
	n.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("100.64.0.0/10"), netip.MustParsePrefix("fd00:10::/64")}
	in := overall()
	in.Node = n
	d := Build(in)
	wants := map[nodeview.Family][]string{
		nodeview.IPv4: {
			"add rule ip netplane pick-tcp-2-pool-20 ip saddr != { 10.0.0.0/8, 100.64.0.0/10 } meta mark set meta mark | 0x4000",
			"add rule ip netplane service-42NFTM6N-ns2/svc2/tcp/p80 ip daddr 172.30.0.42 ip saddr != { 10.0.0.0/8, 100.64.0.0/10 } meta mark set meta mark | 0x4000",
			"add rule ip netplane external-42NFTM6N-ns2/svc2/tcp/p80 ip saddr { 10.0.0.0/8, 100.64.0.0/10 } goto service-42NFTM6N-ns2/svc2/tcp/p80",
		},
	}
	for fam, lines := range wants {
		dump := d.Tables[fam].Dump()
		for _, l := range lines {
			if !strings.Contains(dump, l) {
				t.Errorf("the %v table lacks\n\t%s\nin:\n%s", fam, l, dump)
			}
		}
	}
}

func TestUnallocatedServiceIPsAreDroppedOnlyWithServiceCIDRs(t *testing.T) {
	in := overall()
	in.Node.ServiceCIDRs = nil
	for fam, tbl := range Build(in).Tables {
		var got []string
		for _, r := range tbl.Chains[chClusterIPsCheck].Rules {
			got = append(got, r.Text)
		}
		if want := []string{map[nodeview.Family]string{nodeview.IPv4: "ip", nodeview.IPv6: "ip6"}[fam] + " daddr @cluster-ips reject"}; !cmp.Equal(got, want) {
			t.Errorf("without --service-cidrs, %v cluster-ips-check is %q; want only %q", fam, got, want)
		}
	}
}

// The ids built in place for every endpoint equal those of the Elements
// they stand for, in both families.
func TestElementIDsBuiltInPlaceMatchElements(t *testing.T) {
	for _, c := range []struct{ cip, ep string }{{"172.30.0.1", "10.1.2.3"}, {"fd00:30::1", "fd00:10::2:3"}} {
		k := newSlotKey(netip.MustParseAddr(c.cip), 6, 8080)
		ep := netip.AddrPortFrom(netip.MustParseAddr(c.ep), 9090)
		want := nft.Element{Key: k.at(7), Val: concat(ep.Addr().AsSlice(), port(ep.Port()))}.ID()
		if got := k.elemID(7, ep); got != want {
			t.Errorf("%s slot 7 → %s: id %x, want %x", c.cip, ep, got, want)
		}
		a := ep.Addr()
		if got, want := hairpinID(a), (nft.Element{Key: concat(a.AsSlice(), a.AsSlice())}).ID(); got != want {
			t.Errorf("hairpin %s: id %x, want %x", a, got, want)
		}
	}
}

// at is the key of slot i of k's endpoints as the endpoint maps' type lays
// it out: address, protocol, port (big endian) and slot (host order), each
// padded to 4 bytes.
func (k slotKey) at(i uint32) []byte {
	return concat(k.cip.AsSlice(), []byte{k.proto, 0, 0, 0}, port(k.port), binary.NativeEndian.AppendUint32(nil, i))
}

// port is a port in a concatenation: big endian, padded to a register.
func port(p uint16) []byte { return []byte{byte(p >> 8), byte(p), 0, 0} }

func concat(parts ...[]byte) []byte { return slices.Concat(parts...) }

// A pod can only reach itself through a ClusterIP on its own node, but
// through a NodePort from any node: the hairpin set leaves out another
// node's endpoints of Services reached by ClusterIP only.
func TestHairpinSetHoldsEndpointsThatCanComeBackHere(t *testing.T) {
	for _, c := range []struct {
		name     string
		nodePort bool
		node     string
		want     bool
	}{
		{"ClusterIP, endpoint here", false, "node-a", true},
		{"ClusterIP, endpoint without a node", false, "", true},
		{"ClusterIP, endpoint on another node", false, "node-b", false},
		{"NodePort, endpoint on another node", true, "node-b", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := input(testNode,
				svc("ns", "s", func(s *v1.Service) {
					s.Spec.ClusterIP = "172.30.0.9"
					s.Spec.Ports = []v1.ServicePort{tcp("p", 80)}
					if c.nodePort {
						s.Spec.Type = v1.ServiceTypeNodePort
						s.Spec.Ports[0].NodePort = 30009
					}
				}),
				slice("ns/s", "s-a", map[string]int32{"p": 8080}, v1.ProtocolTCP, ep{ip: "10.9.0.1", node: c.node}, ep{ip: "10.9.0.2", node: "node-a"}))
			a := netip.MustParseAddr("10.9.0.1")
			hp := Build(in).Tables[nodeview.IPv4].Sets[setHairpin]
			if got := hp != nil && hp.Value(hairpinID(a)) != 0; got != c.want {
				t.Errorf("10.9.0.1 in the hairpin set: %v, want %v", got, c.want)
			}
		})
	}
}
