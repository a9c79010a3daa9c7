package policy

import (
	"net"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/netplane/netplane/nft"
)

// ClusterNetworkPolicy on the real kernel: the lab of kernel_test.go (a
// node namespace, x/a, x/b, y/a, y/b on its bridge serving TCP and UDP on
// 80 and 81, the node serving 10.244.0.1:80), programmed through the
// driver with partial syncs as the node role does, one case per rule of
// CNP-SEMANTICS.md. Each probe must do what the case states and what the
// API reading (cnp_oracle_test.go) says.

// Builders of the API's objects, short enough for a table of cases.

func admin(name string, prio int32, subject cnpv1.ClusterNetworkPolicySubject) *cnpv1.ClusterNetworkPolicy {
	return cnpObject(name, cnpv1.AdminTier, prio, subject)
}

func baseline(name string, prio int32, subject cnpv1.ClusterNetworkPolicySubject) *cnpv1.ClusterNetworkPolicy {
	return cnpObject(name, cnpv1.BaselineTier, prio, subject)
}

func inNamespace(ns string) cnpv1.ClusterNetworkPolicySubject {
	return cnpv1.ClusterNetworkPolicySubject{Namespaces: sel("ns", ns)}
}

func podsOf(ns, pod string) cnpv1.ClusterNetworkPolicySubject {
	return cnpv1.ClusterNetworkPolicySubject{Pods: &cnpv1.NamespacedPod{NamespaceSelector: *sel("ns", ns), PodSelector: *sel("pod", pod)}}
}

func nsPeerOf(ns string) cnpv1.ClusterNetworkPolicyEgressPeer {
	return cnpv1.ClusterNetworkPolicyEgressPeer{Namespaces: sel("ns", ns)}
}

func podPeerOf(ns, pod string) cnpv1.ClusterNetworkPolicyEgressPeer {
	return cnpv1.ClusterNetworkPolicyEgressPeer{Pods: &cnpv1.NamespacedPod{NamespaceSelector: *sel("ns", ns), PodSelector: *sel("pod", pod)}}
}

func networks(cidrs ...cnpv1.CIDR) cnpv1.ClusterNetworkPolicyEgressPeer {
	return cnpv1.ClusterNetworkPolicyEgressPeer{Networks: cidrs}
}

func tcpPort(n int32) cnpv1.ClusterNetworkPolicyProtocol {
	return cnpv1.ClusterNetworkPolicyProtocol{TCP: &cnpv1.ClusterNetworkPolicyProtocolTCP{DestinationPort: &cnpv1.Port{Number: n}}}
}

func udpRange(from, to int32) cnpv1.ClusterNetworkPolicyProtocol {
	return cnpv1.ClusterNetworkPolicyProtocol{UDP: &cnpv1.ClusterNetworkPolicyProtocolUDP{DestinationPort: &cnpv1.Port{Range: &cnpv1.PortRange{Start: from, End: to}}}}
}

func namedPortOf(name string) cnpv1.ClusterNetworkPolicyProtocol {
	return cnpv1.ClusterNetworkPolicyProtocol{DestinationNamedPort: name}
}

// from adds an ingress rule; to an egress rule.
func from(p *cnpv1.ClusterNetworkPolicy, a cnpv1.ClusterNetworkPolicyRuleAction, peers []cnpv1.ClusterNetworkPolicyEgressPeer, protos ...cnpv1.ClusterNetworkPolicyProtocol) *cnpv1.ClusterNetworkPolicy {
	r := cnpv1.ClusterNetworkPolicyIngressRule{Action: a, Protocols: protos}
	for _, peer := range peers {
		r.From = append(r.From, cnpv1.ClusterNetworkPolicyIngressPeer{Namespaces: peer.Namespaces, Pods: peer.Pods})
	}
	p.Spec.Ingress = append(p.Spec.Ingress, r)
	return p
}

func to(p *cnpv1.ClusterNetworkPolicy, a cnpv1.ClusterNetworkPolicyRuleAction, peers []cnpv1.ClusterNetworkPolicyEgressPeer, protos ...cnpv1.ClusterNetworkPolicyProtocol) *cnpv1.ClusterNetworkPolicy {
	p.Spec.Egress = append(p.Spec.Egress, cnpv1.ClusterNetworkPolicyEgressRule{Action: a, To: peers, Protocols: protos})
	return p
}

func cnpPeers(p ...cnpv1.ClusterNetworkPolicyEgressPeer) []cnpv1.ClusterNetworkPolicyEgressPeer {
	return p
}

const (
	actAccept = cnpv1.ClusterNetworkPolicyRuleActionAccept
	actDeny   = cnpv1.ClusterNetworkPolicyRuleActionDeny
	actPass   = cnpv1.ClusterNetworkPolicyRuleActionPass
)

var denyAllIngressX = policy("x", "deny-all", netv1.NetworkPolicySpec{PodSelector: *all, PolicyTypes: ingressOnly})

// labNode is a Node whose address is the lab node's.
var labNode = &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"zone": "a"}},
	Status: v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "10.244.0.1"}}}}

// cnpCase is one rule of CNP-SEMANTICS.md on the kernel.
type cnpCase struct {
	name   string
	cnps   []*cnpv1.ClusterNetworkPolicy
	nps    []*netv1.NetworkPolicy
	probes []kprobe
}

var cnpKernelCases = []cnpCase{
	{"Admin Deny overrides a NetworkPolicy that allows",
		[]*cnpv1.ClusterNetworkPolicy{from(admin("deny-y", 1, inNamespace("x")), actDeny, cnpPeers(nsPeerOf("y")))},
		[]*netv1.NetworkPolicy{policy("x", "allow-y", netv1.NetworkPolicySpec{PodSelector: *all, Ingress: []netv1.NetworkPolicyIngressRule{ingress(peers(nsPeer(sel("ns", "y"))))}})},
		[]kprobe{{"y/a", "x/a", 80, tcp, false, ""}, {"x/b", "x/a", 80, tcp, false, ""}, {"y/a", "x/b", 81, udp, false, ""}}},
	{"Admin Accept overrides a NetworkPolicy that denies",
		[]*cnpv1.ClusterNetworkPolicy{from(admin("accept-yb", 1, inNamespace("x")), actAccept, cnpPeers(podPeerOf("y", "b")))},
		[]*netv1.NetworkPolicy{denyAllIngressX},
		[]kprobe{{"y/b", "x/a", 80, tcp, true, ""}, {"y/a", "x/a", 80, tcp, false, ""}, {"x/b", "x/a", 80, tcp, false, ""}}},
	{"Pass skips the rest of the Admin tier and the NetworkPolicy decides",
		[]*cnpv1.ClusterNetworkPolicy{
			from(admin("pass-y", 1, inNamespace("x")), actPass, cnpPeers(nsPeerOf("y"))),
			from(admin("accept-all", 2, inNamespace("x")), actAccept, cnpPeers(nsPeerOf("y"), nsPeerOf("x")))},
		[]*netv1.NetworkPolicy{denyAllIngressX},
		[]kprobe{{"y/a", "x/a", 80, tcp, false, ""}, {"x/b", "x/a", 80, tcp, true, ""}}},
	{"Baseline decides for pods no NetworkPolicy isolates, and only for them",
		[]*cnpv1.ClusterNetworkPolicy{from(baseline("deny-y", 1, cnpv1.ClusterNetworkPolicySubject{Namespaces: &metav1.LabelSelector{}}), actDeny, cnpPeers(nsPeerOf("y")))},
		[]*netv1.NetworkPolicy{policy("x", "allow-y-to-a", netv1.NetworkPolicySpec{PodSelector: *sel("pod", "a"), Ingress: []netv1.NetworkPolicyIngressRule{ingress(peers(nsPeer(sel("ns", "y"))))}})},
		[]kprobe{{"y/a", "x/a", 80, tcp, true, ""}, {"y/a", "x/b", 80, tcp, false, ""}, {"x/a", "x/b", 80, tcp, true, ""}, {"y/a", "y/b", 80, tcp, false, ""}}},
	{"Baseline Pass leaves the connection to the default, allowed",
		[]*cnpv1.ClusterNetworkPolicy{
			from(baseline("pass-yb", 1, inNamespace("x")), actPass, cnpPeers(podPeerOf("y", "b"))),
			from(baseline("deny-y", 2, inNamespace("x")), actDeny, cnpPeers(nsPeerOf("y")))},
		nil,
		[]kprobe{{"y/b", "x/a", 80, tcp, true, ""}, {"y/a", "x/a", 80, tcp, false, ""}}},
	{"lower priority first within a tier, then rule order",
		[]*cnpv1.ClusterNetworkPolicy{
			from(admin("deny-y-later", 5, inNamespace("x")), actDeny, cnpPeers(nsPeerOf("y"))),
			from(from(admin("accept-ya-first", 3, inNamespace("x")), actAccept, cnpPeers(podPeerOf("y", "a"))), actDeny, cnpPeers(podPeerOf("y", "a"), podPeerOf("y", "b")))},
		nil,
		[]kprobe{{"y/a", "x/a", 80, tcp, true, ""}, {"y/b", "x/a", 80, tcp, false, ""}}},
	{"a subject of pods holds only those pods",
		[]*cnpv1.ClusterNetworkPolicy{from(admin("deny-to-xa", 1, podsOf("x", "a")), actDeny, cnpPeers(nsPeerOf("y")))},
		nil,
		[]kprobe{{"y/a", "x/a", 80, tcp, false, ""}, {"y/a", "x/b", 80, tcp, true, ""}}},
	{"protocols: a TCP port and a UDP range",
		[]*cnpv1.ClusterNetworkPolicy{from(admin("deny-some", 1, inNamespace("x")), actDeny, cnpPeers(nsPeerOf("y")), tcpPort(80), udpRange(80, 81))},
		nil,
		[]kprobe{{"y/a", "x/a", 80, tcp, false, ""}, {"y/a", "x/a", 81, tcp, true, ""}, {"y/a", "x/a", 81, udp, false, ""}, {"y/a", "x/a", 80, udp, false, ""}}},
	{"a destination named port is the destination pod's",
		[]*cnpv1.ClusterNetworkPolicy{
			from(admin("deny-named", 1, inNamespace("x")), actDeny, cnpPeers(nsPeerOf("y")), namedPortOf("serve-81-udp")),
			to(admin("deny-named-egress", 2, inNamespace("y")), actDeny, cnpPeers(podPeerOf("x", "b")), namedPortOf("serve-80-tcp"))},
		nil,
		[]kprobe{{"y/a", "x/a", 81, udp, false, ""}, {"y/a", "x/a", 81, tcp, true, ""}, {"y/a", "x/b", 80, tcp, false, ""}, {"y/a", "x/a", 80, tcp, true, ""}}},
	{"egress to networks",
		[]*cnpv1.ClusterNetworkPolicy{to(admin("no-node-net", 1, inNamespace("y")), actDeny, cnpPeers(networks("10.244.0.1/32")))},
		nil,
		[]kprobe{{"y/a", "10.244.0.1", 80, tcp, false, ""}, {"x/a", "10.244.0.1", 80, tcp, true, ""}, {"y/a", "x/a", 80, tcp, true, ""}}},
	{"egress to nodes is to their addresses",
		[]*cnpv1.ClusterNetworkPolicy{to(admin("no-nodes", 1, inNamespace("y")), actDeny, cnpPeers(cnpv1.ClusterNetworkPolicyEgressPeer{Nodes: sel("zone", "a")}))},
		nil,
		[]kprobe{{"y/a", "10.244.0.1", 80, tcp, false, ""}, {"x/a", "10.244.0.1", 80, tcp, true, ""}, {"y/a", "x/a", 80, tcp, true, ""}}},
	{"an egress Accept still meets the destination's ingress",
		[]*cnpv1.ClusterNetworkPolicy{
			to(admin("y-out", 1, inNamespace("y")), actAccept, cnpPeers(nsPeerOf("x"))),
			from(admin("x-in", 2, inNamespace("x")), actDeny, cnpPeers(podPeerOf("y", "a")))},
		nil,
		[]kprobe{{"y/a", "x/a", 80, tcp, false, ""}, {"y/b", "x/a", 80, tcp, true, ""}}},
	{"a rule with a peer this node does not know denies everything",
		[]*cnpv1.ClusterNetworkPolicy{from(admin("unknown", 1, podsOf("x", "a")), actDeny, cnpPeers(podPeerOf("z", "q"), cnpv1.ClusterNetworkPolicyEgressPeer{}))},
		nil,
		[]kprobe{{"y/a", "x/a", 80, tcp, false, ""}, {"x/b", "x/a", 81, udp, false, ""}, {"y/a", "x/b", 80, tcp, true, ""}}},
}

func TestKernelEnforcesClusterNetworkPolicy(t *testing.T) {
	l := newLabVia(t, true)
	c := &tiered{cluster: l.c, cnps: map[string]*cnpv1.ClusterNetworkPolicy{}, nodes: map[string]*v1.Node{}}
	c.setNode(labNode)
	for _, tc := range cnpKernelCases {
		t.Run(tc.name, func(t *testing.T) {
			for _, p := range tc.cnps {
				c.setCNP(t, p)
			}
			for _, np := range tc.nps {
				c.setPolicy(t, np)
			}
			l.load()
			l.checkTiered(t, c, tc.probes...)
			for _, p := range tc.cnps {
				c.deleteCNP(p.Name)
			}
			for _, np := range tc.nps {
				c.deletePolicy(podKey(np.Namespace, np.Name))
			}
			l.load()
		})
	}
	t.Run("hostNetwork pods are neither selected nor matched", func(t *testing.T) {
		// The node's address as a hostNetwork pod of y: a Deny to y's pods does not reach it.
		hp := modelPod("y", "host")
		hp.Spec.NodeName, hp.Spec.HostNetwork = "n1", true
		hp.Status.PodIPs = []v1.PodIP{{IP: "10.244.0.1"}}
		c.setPod(hp)
		defer func() { c.deletePod(podKey("y", "host")); l.load() }()
		c.setCNP(t, to(admin("no-y", 1, inNamespace("x")), actDeny, cnpPeers(nsPeerOf("y"))))
		defer c.deleteCNP("no-y")
		l.load()
		l.checkTiered(t, c, kprobe{"x/a", "10.244.0.1", 80, tcp, true, ""}, kprobe{"x/a", "y/a", 80, tcp, false, ""})
	})
	t.Run("established connections keep their verdict", func(t *testing.T) {
		var conn net.Conn
		err := l.pods["y/a"].Do(func() error {
			var err error
			conn, err = net.DialTimeout("tcp4", "10.244.0.3:81", time.Second)
			return err
		})
		if err != nil || !echoes(conn) {
			t.Fatalf("y/a -> x/b before the policy: %v", err)
		}
		defer conn.Close()
		c.setCNP(t, from(admin("deny-y", 1, inNamespace("x")), actDeny, cnpPeers(nsPeerOf("y"))))
		defer c.deleteCNP("deny-y")
		l.load()
		if !echoes(conn) {
			t.Error("the established connection y/a -> x/b was cut by an Admin Deny")
		}
		l.checkTiered(t, c, kprobe{"y/a", "x/b", 81, tcp, false, ""})
		n, err := nft.Packets(l.dialer, TableID, c.models["n1"].denyChains(Ingress)[1:]...)
		if err != nil || n[c.models["n1"].denyChains(Ingress)[1]] == 0 {
			t.Errorf("the policy's deny chain counted %v (%v); want the denied SYNs", n, err)
		}
	})
	t.Run("judged after DNAT, on the backend", func(t *testing.T) {
		l.nft(t, "table ip svc-cnp-test {\n chain prerouting {\n  type nat hook prerouting priority -100; policy accept;\n"+
			"  ip daddr 10.96.0.11 tcp dport 80 dnat to 10.244.0.2:80\n }\n}\n")
		defer l.nft(t, "delete table ip svc-cnp-test\n")
		c.setCNP(t, from(admin("deny-ya", 1, podsOf("x", "a")), actDeny, cnpPeers(podPeerOf("y", "a"))))
		defer c.deleteCNP("deny-ya")
		l.load()
		l.checkTiered(t, c, kprobe{"y/a", "10.96.0.11", 80, tcp, false, "x/a"}, kprobe{"y/b", "10.96.0.11", 80, tcp, true, "x/a"})
	})
}

// checkTiered makes every probe at once and compares with what the case
// states and what the API reading with both tiers says.
func (l *lab) checkTiered(t *testing.T, c *tiered, probes ...kprobe) {
	t.Helper()
	got := l.probeAll(probes)
	for i, p := range probes {
		if got[i] != p.want {
			t.Errorf("%s -> %s %s/%d: got through=%v, want %v", p.from, p.to, p.proto, p.port, got[i], p.want)
		}
		dst := p.to
		if p.backend != "" {
			dst = p.backend
		}
		if api := c.allowedTiered(c.endpoint(t, p.from), c.endpoint(t, dst), int32(p.port), p.proto); api != p.want {
			t.Errorf("%s -> %s %s/%d: the API reading says %v, the case %v", p.from, dst, p.proto, p.port, api, p.want)
		}
	}
}
