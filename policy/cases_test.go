package policy

import (
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// step changes the cluster; spots are connections whose verdict the case
// states outright, so a wrong reference cannot agree with a wrong model.
type step struct {
	name  string
	do    func(t testing.TB, c *cluster)
	spots []spot
}

// spot: from and to are "ns/pod" (the pod's IPv4 address) or an address.
type spot struct {
	from, to string
	port     int32
	proto    v1.Protocol
	allowed  bool
}

func set(nps ...*netv1.NetworkPolicy) func(testing.TB, *cluster) {
	return func(t testing.TB, c *cluster) {
		for _, np := range nps {
			c.setPolicy(t, np)
		}
	}
}

var (
	tcp, udp, sctp = v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP
	all            = &metav1.LabelSelector{}
)

// upstreamCases follow the upstream e2e suite's cases on its model.
var upstreamCases = []struct {
	name  string
	steps []step
}{
	{"no policy allows everything", []step{{"", set(), []spot{{"y/a", "x/a", 80, tcp, true}, {"x/a", "192.0.2.10", 81, udp, true}}}}},
	{"default deny ingress isolates every pod of the namespace", []step{{"", set(policy("x", "deny", netv1.NetworkPolicySpec{PodSelector: *all, PolicyTypes: ingressOnly})),
		[]spot{{"y/a", "x/a", 80, tcp, false}, {"x/b", "x/a", 80, tcp, false}, {"x/a", "y/a", 80, tcp, true}, {"192.0.2.10", "x/c", 80, udp, false}}}}},
	{"default deny egress", []step{{"", set(policy("x", "deny", netv1.NetworkPolicySpec{PodSelector: *all, PolicyTypes: egressOnly})),
		[]spot{{"x/a", "y/a", 80, tcp, false}, {"x/a", "192.0.2.10", 80, tcp, false}, {"y/a", "x/a", 80, tcp, true}}}}},
	{"default deny both directions", []step{{"", set(policy("x", "deny", netv1.NetworkPolicySpec{PodSelector: *all, PolicyTypes: bothTypes})),
		[]spot{{"x/a", "x/b", 80, tcp, false}, {"z/a", "x/b", 81, sctp, false}, {"y/a", "z/b", 81, sctp, true}}}}},
	{"allow all ingress with an empty rule", []step{{"", set(
		policy("x", "deny", netv1.NetworkPolicySpec{PodSelector: *all, PolicyTypes: ingressOnly}),
		policy("x", "allow", netv1.NetworkPolicySpec{PodSelector: *all, Ingress: []netv1.NetworkPolicyIngressRule{{}}})),
		[]spot{{"z/c", "x/a", 81, udp, true}, {"192.0.2.10", "x/a", 80, tcp, true}}}}},
	{"allow all egress with an empty rule", []step{{"", set(policy("x", "allow", netv1.NetworkPolicySpec{PodSelector: *all, PolicyTypes: egressOnly,
		Egress: []netv1.NetworkPolicyEgressRule{{}}})), []spot{{"x/a", "192.0.2.200", 80, tcp, true}}}}},
	{"pod selector allows pods of the policy's namespace only", []step{{"", set(policy("x", "p", netv1.NetworkPolicySpec{PodSelector: *sel("pod", "a"),
		Ingress: []netv1.NetworkPolicyIngressRule{ingress(peers(podPeer(sel("pod", "b"))))}})),
		[]spot{{"x/b", "x/a", 80, tcp, true}, {"y/b", "x/a", 80, tcp, false}, {"x/c", "x/a", 80, tcp, false}, {"y/b", "x/b", 80, tcp, true}}}}},
	{"namespace selector allows every pod of the namespaces", []step{{"", set(policy("x", "p", netv1.NetworkPolicySpec{PodSelector: *sel("pod", "a"),
		Ingress: []netv1.NetworkPolicyIngressRule{ingress(peers(nsPeer(sel("ns", "y"))))}})),
		[]spot{{"y/c", "x/a", 80, tcp, true}, {"x/b", "x/a", 80, tcp, false}, {"z/a", "x/a", 80, tcp, false}}}}},
	{"namespace and pod selector in one peer are ANDed", []step{{"", set(policy("x", "p", netv1.NetworkPolicySpec{PodSelector: *sel("pod", "a"),
		Ingress: []netv1.NetworkPolicyIngressRule{ingress(peers(bothPeer(sel("ns", "y"), sel("pod", "b"))))}})),
		[]spot{{"y/b", "x/a", 80, tcp, true}, {"y/c", "x/a", 80, tcp, false}, {"x/b", "x/a", 80, tcp, false}}}}},
	{"two peers are ORed", []step{{"", set(policy("x", "p", netv1.NetworkPolicySpec{PodSelector: *sel("pod", "a"),
		Ingress: []netv1.NetworkPolicyIngressRule{ingress(peers(nsPeer(sel("ns", "y")), podPeer(sel("pod", "b"))))}})),
		[]spot{{"y/c", "x/a", 80, tcp, true}, {"x/b", "x/a", 80, tcp, true}, {"z/b", "x/a", 80, tcp, false}}}}},
	{"matchExpressions NotIn, In, Exists, DoesNotExist", []step{{"", set(
		policy("x", "notin", netv1.NetworkPolicySpec{PodSelector: *exprSel("pod", metav1.LabelSelectorOpIn, "a", "b"),
			Ingress: []netv1.NetworkPolicyIngressRule{ingress(peers(nsPeer(exprSel("ns", metav1.LabelSelectorOpNotIn, "x", "y"))))}}),
		policy("y", "exists", netv1.NetworkPolicySpec{PodSelector: *exprSel("pod", metav1.LabelSelectorOpExists),
			Ingress: []netv1.NetworkPolicyIngressRule{ingress(peers(bothPeer(all, exprSel("pod", metav1.LabelSelectorOpDoesNotExist))))}})),
		[]spot{{"z/a", "x/a", 80, tcp, true}, {"y/a", "x/b", 80, tcp, false}, {"y/a", "x/c", 80, tcp, true}, {"x/a", "y/a", 80, tcp, false}}}}},
	{"ipBlock with except, ingress", []step{{"", set(policy("x", "p", netv1.NetworkPolicySpec{PodSelector: *sel("pod", "a"),
		Ingress: []netv1.NetworkPolicyIngressRule{ingress(peers(blockPeer("10.0.0.0/16", "10.0.2.0/24"), blockPeer("fd00::/64", "fd00::2:0/112")))}})),
		[]spot{{"z/a", "x/a", 80, tcp, true}, {"y/a", "x/a", 80, tcp, false}, {"192.0.2.10", "x/a", 80, tcp, false}}}}},
	{"ipBlock with except, egress", []step{{"", set(policy("x", "p", netv1.NetworkPolicySpec{PodSelector: *sel("pod", "a"), PolicyTypes: egressOnly,
		Egress: []netv1.NetworkPolicyEgressRule{egress(peers(blockPeer("192.0.2.0/24", "192.0.2.128/25")))}})),
		[]spot{{"x/a", "192.0.2.10", 80, tcp, true}, {"x/a", "192.0.2.200", 80, tcp, false}, {"x/a", "y/a", 80, tcp, false}}}}},
	{"an address in an except is allowed by another rule", []step{{"", set(policy("x", "p", netv1.NetworkPolicySpec{PodSelector: *sel("pod", "a"), PolicyTypes: egressOnly,
		Egress: []netv1.NetworkPolicyEgressRule{egress(peers(blockPeer("10.0.0.0/16", "10.0.2.2/32"))), egress(peers(blockPeer("10.0.2.2/32")), port(tcp, 80))}})),
		[]spot{{"x/a", "y/b", 80, tcp, true}, {"x/a", "y/b", 81, tcp, false}, {"x/a", "y/c", 81, tcp, true}}}}},
	{"named ports resolve on each destination pod", []step{
		{"", set(policy("x", "p", netv1.NetworkPolicySpec{PodSelector: *all,
			Ingress: []netv1.NetworkPolicyIngressRule{ingress(nil, namedPort(tcp, "serve-81-tcp"), namedPort(udp, "serve-80-udp"))}})),
			[]spot{{"y/a", "x/a", 81, tcp, true}, {"y/a", "x/a", 80, tcp, false}, {"y/a", "x/a", 80, udp, true}}},
		{"x/c serves serve-81-tcp on 80", func(t testing.TB, c *cluster) {
			p := modelPod("x", "c")
			p.Spec.Containers[0].Ports[0].Name, p.Spec.Containers[3].Ports[0].Name = "serve-81-tcp", "serve-80-tcp"
			c.setPod(p)
		}, []spot{{"y/a", "x/c", 80, tcp, true}, {"y/a", "x/c", 81, tcp, false}}},
	}},
	{"named port protocols must match the pod's", []step{{"", set(policy("x", "p", netv1.NetworkPolicySpec{PodSelector: *all,
		Ingress: []netv1.NetworkPolicyIngressRule{ingress(nil, namedPort(udp, "serve-80-tcp"))}})),
		[]spot{{"y/a", "x/a", 80, tcp, false}, {"y/a", "x/a", 80, udp, false}}}}},
	{"named ports in egress, to pods and to no address block", []step{{"", set(policy("x", "p", netv1.NetworkPolicySpec{PodSelector: *sel("pod", "a"), PolicyTypes: egressOnly,
		Egress: []netv1.NetworkPolicyEgressRule{
			egress(peers(nsPeer(sel("ns", "y"))), namedPort(tcp, "serve-81-tcp")),
			egress(peers(blockPeer("0.0.0.0/0")), namedPort(tcp, "serve-80-tcp")),
			egress(nil, namedPort(sctp, "serve-80-sctp"))}})),
		[]spot{{"x/a", "y/b", 81, tcp, true}, {"x/a", "z/b", 81, tcp, false}, {"x/a", "192.0.2.10", 80, tcp, false}, {"x/a", "z/c", 80, sctp, true}}}}},
	{"endPort makes a range", []step{{"", set(policy("x", "p", netv1.NetworkPolicySpec{PodSelector: *all,
		Ingress: []netv1.NetworkPolicyIngressRule{ingress(nil, portRange(tcp, 81, 90), portRange(udp, 70, 80))}})),
		[]spot{{"y/a", "x/a", 81, tcp, true}, {"y/a", "x/a", 80, tcp, false}, {"y/a", "x/a", 80, udp, true}, {"y/a", "x/a", 81, udp, false}}}}},
	{"UDP rule allows UDP only", []step{{"", set(policy("x", "p", netv1.NetworkPolicySpec{PodSelector: *all,
		Ingress: []netv1.NetworkPolicyIngressRule{ingress(peers(nsPeer(all)), port(udp, 80))}})),
		[]spot{{"y/a", "x/a", 80, udp, true}, {"y/a", "x/a", 80, tcp, false}}}}},
	{"SCTP rule allows SCTP only", []step{{"", set(policy("x", "p", netv1.NetworkPolicySpec{PodSelector: *all,
		Ingress: []netv1.NetworkPolicyIngressRule{ingress(peers(nsPeer(all)), port(sctp, 81))}})),
		[]spot{{"y/a", "x/a", 81, sctp, true}, {"y/a", "x/a", 81, udp, false}}}}},
	{"a port without a number allows the whole protocol", []step{{"", set(policy("x", "p", netv1.NetworkPolicySpec{PodSelector: *all,
		Ingress: []netv1.NetworkPolicyIngressRule{ingress(nil, netv1.NetworkPolicyPort{Protocol: &udp})}})),
		[]spot{{"y/a", "x/a", 81, udp, true}, {"y/a", "x/a", 81, tcp, false}}}}},
	{"policies are additive", []step{{"", set(
		policy("x", "from-y", netv1.NetworkPolicySpec{PodSelector: *sel("pod", "a"), Ingress: []netv1.NetworkPolicyIngressRule{ingress(peers(nsPeer(sel("ns", "y"))), port(tcp, 80))}}),
		policy("x", "from-z", netv1.NetworkPolicySpec{PodSelector: *all, Ingress: []netv1.NetworkPolicyIngressRule{ingress(peers(nsPeer(sel("ns", "z"))), port(tcp, 81))}})),
		[]spot{{"y/a", "x/a", 80, tcp, true}, {"z/a", "x/a", 81, tcp, true}, {"y/a", "x/a", 81, tcp, false}, {"y/a", "x/b", 80, tcp, false}}}}},
	{"a policy selecting no pod changes nothing", []step{{"", set(policy("x", "p", netv1.NetworkPolicySpec{PodSelector: *sel("pod", "none"), PolicyTypes: bothTypes})),
		[]spot{{"y/a", "x/a", 80, tcp, true}}}}},
	{"egress rules of a policy typed Ingress only are ignored", []step{{"", set(policy("x", "p", netv1.NetworkPolicySpec{PodSelector: *all, PolicyTypes: ingressOnly,
		Egress: []netv1.NetworkPolicyEgressRule{egress(peers(podPeer(sel("pod", "b"))))}})),
		[]spot{{"x/a", "y/a", 80, tcp, true}, {"y/a", "x/a", 80, tcp, false}}}}},
	{"a pod created after its policy is isolated", []step{
		{"", set(policy("x", "p", netv1.NetworkPolicySpec{PodSelector: *sel("pod", "d"), Ingress: []netv1.NetworkPolicyIngressRule{ingress(peers(podPeer(sel("pod", "a"))))}})), nil},
		{"x/d created", func(t testing.TB, c *cluster) { c.setPod(modelPod("x", "d")) },
			[]spot{{"x/a", "x/d", 80, tcp, true}, {"x/b", "x/d", 80, tcp, false}}},
		{"x/d deleted", func(t testing.TB, c *cluster) { c.deletePod(podKey("x", "d")) }, nil},
	}},
	{"pod label changes move pods in and out", []step{
		{"", set(policy("x", "p", netv1.NetworkPolicySpec{PodSelector: *sel("pod", "a"),
			Ingress: []netv1.NetworkPolicyIngressRule{ingress(peers(bothPeer(all, sel("pod", "b"))))}})), nil},
		{"y/b relabelled pod=x", func(t testing.TB, c *cluster) {
			p := modelPod("y", "b")
			p.Labels = map[string]string{"pod": "x"}
			c.setPod(p)
		}, []spot{{"y/b", "x/a", 80, tcp, false}, {"z/b", "x/a", 80, tcp, true}}},
		{"x/c relabelled pod=a", func(t testing.TB, c *cluster) {
			p := modelPod("x", "c")
			p.Labels = map[string]string{"pod": "a"}
			c.setPod(p)
		}, []spot{{"y/a", "x/c", 80, tcp, false}, {"x/b", "x/c", 80, tcp, true}}},
	}},
	{"namespace label changes move its pods", []step{
		{"", set(policy("x", "p", netv1.NetworkPolicySpec{PodSelector: *all,
			Ingress: []netv1.NetworkPolicyIngressRule{ingress(peers(nsPeer(sel("team", "blue"))))}})), []spot{{"y/a", "x/a", 80, tcp, false}}},
		{"y labelled team=blue", func(t testing.TB, c *cluster) {
			ns := modelNamespace("y")
			ns.Labels["team"] = "blue"
			c.setNamespace(ns)
		}, []spot{{"y/a", "x/a", 80, tcp, true}, {"z/a", "x/a", 80, tcp, false}}},
		{"y unlabelled", func(t testing.TB, c *cluster) { c.setNamespace(modelNamespace("y")) }, []spot{{"y/a", "x/a", 80, tcp, false}}},
	}},
	{"policy updated and deleted", []step{
		{"", set(policy("x", "p", netv1.NetworkPolicySpec{PodSelector: *all, Ingress: []netv1.NetworkPolicyIngressRule{ingress(peers(nsPeer(sel("ns", "y"))), port(tcp, 80))}})), nil},
		{"port 80 becomes 81, y becomes z", set(policy("x", "p", netv1.NetworkPolicySpec{PodSelector: *all,
			Ingress: []netv1.NetworkPolicyIngressRule{ingress(peers(nsPeer(sel("ns", "z"))), port(tcp, 81))}})),
			[]spot{{"y/a", "x/a", 80, tcp, false}, {"z/a", "x/a", 81, tcp, true}}},
		{"deleted", func(t testing.TB, c *cluster) { c.deletePolicy(podKey("x", "p")) }, []spot{{"y/a", "x/b", 80, tcp, true}}},
	}},
	{"pods without an address or finished match nothing", []step{
		{"", set(policy("x", "p", netv1.NetworkPolicySpec{PodSelector: *all, Ingress: []netv1.NetworkPolicyIngressRule{ingress(peers(podPeer(sel("pod", "b"))))}})), nil},
		{"x/b succeeded", func(t testing.TB, c *cluster) {
			p := modelPod("x", "b")
			p.Status.Phase = v1.PodSucceeded
			c.setPod(p)
		}, []spot{{"x/b", "x/a", 80, tcp, false}}},
		{"x/b running again at another address", func(t testing.TB, c *cluster) {
			p := modelPod("x", "b")
			p.Status.PodIPs = []v1.PodIP{{IP: "10.0.1.99"}}
			c.setPod(p)
		}, []spot{{"x/b", "x/a", 80, tcp, true}}},
	}},
}

func TestUpstreamCasesMatchTheAPI(t *testing.T) {
	for _, tc := range upstreamCases {
		t.Run(tc.name, func(t *testing.T) {
			c := newModelCluster()
			for _, st := range tc.steps {
				st.do(t, c)
				c.checkStep(t, st)
			}
		})
	}
}

// checkStep compares the incremental models, and models built afresh,
// with the API on the whole truth table, the two builds with each other,
// and the spots with both.
func (c *cluster) checkStep(t *testing.T, st step) {
	t.Helper()
	prefix := ""
	if st.name != "" {
		prefix = "after " + st.name + ": "
	}
	c.checkTruthTable(t, c.models, outside)
	fresh := c.fresh(t)
	for node, m := range c.models {
		if got, want := m.Table().Dump(), fresh[node].Table().Dump(); got != want {
			t.Errorf("%snode %s: the incremental table differs from one built afresh:\n%s", prefix, node, lineDiff(want, got))
		}
	}
	for _, s := range st.spots {
		from, to := c.endpoint(t, s.from), c.endpoint(t, s.to)
		proto, _ := protocolNumber(s.proto)
		if got := c.allowed(from, to, s.port, s.proto); got != s.allowed {
			t.Errorf("%sreference: %s -> %s %s/%d allowed=%v, want %v", prefix, s.from, s.to, s.proto, s.port, got, s.allowed)
		}
		if got, steps := c.judge(c.models, from, to, uint16(s.port), proto); got != s.allowed {
			t.Errorf("%stables: %s -> %s %s/%d allowed=%v, want %v; trace:\n  %s", prefix, s.from, s.to, s.proto, s.port, got, s.allowed, strings.Join(steps, "\n  "))
		}
	}
}

func (c *cluster) endpoint(t testing.TB, s string) endpoint {
	if ns, name, ok := strings.Cut(s, "/"); ok {
		p := c.pods[podKey(ns, name)]
		if p == nil {
			t.Fatalf("no pod %s", s)
		}
		return endpoint{pod: p, ip: PodFromAPI(p).IPs[0]}
	}
	return endpoint{ip: netip.MustParseAddr(s)}
}

// lineDiff lists the lines only in want (-) and only in got (+).
func lineDiff(want, got string) string {
	count := map[string]int{}
	for _, l := range strings.Split(want, "\n") {
		count[l]++
	}
	for _, l := range strings.Split(got, "\n") {
		count[l]--
	}
	var b strings.Builder
	for l, n := range count {
		for ; n > 0; n-- {
			b.WriteString("- " + l + "\n")
		}
		for ; n < 0; n++ {
			b.WriteString("+ " + l + "\n")
		}
	}
	return b.String()
}
