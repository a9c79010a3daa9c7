package policy

import (
	"fmt"
	"net/netip"
	"strings"

	v1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The upstream e2e model (test/e2e/network/netpol): namespaces x, y, z
// with pods a, b, c, labelled pod=<name>, each serving TCP, UDP and SCTP on
// 80 and 81 with named ports serve-<port>-<proto>. Pods of x and y run on
// node n1, those of z on n2, so half the probes cross nodes.

var (
	modelNamespaces = []string{"x", "y", "z"}
	modelPods       = []string{"a", "b", "c"}
	// outside are addresses outside the cluster.
	outside = []netip.Addr{netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("192.0.2.200"), netip.MustParseAddr("2001:db8::10")}
)

func modelNode(ns string) string {
	if ns == "z" {
		return "n2"
	}
	return "n1"
}

func modelNamespace(name string) *v1.Namespace {
	return &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name,
		Labels: map[string]string{"kubernetes.io/metadata.name": name, "ns": name}}}
}

// modelPod is pod name of namespace ns; its addresses are 10.0.<ns>.<pod>
// and fd00::<ns>:<pod>, counting from 1.
func modelPod(ns, name string) *v1.Pod {
	i, j := strings.Index("xyz", ns)+1, strings.Index("abcdefgh", name)+1
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"pod": name}},
		Spec:       v1.PodSpec{NodeName: modelNode(ns)},
		Status: v1.PodStatus{Phase: v1.PodRunning, PodIPs: []v1.PodIP{
			{IP: fmt.Sprintf("10.0.%d.%d", i, j)}, {IP: fmt.Sprintf("fd00::%d:%d", i, j)}}},
	}
	for _, port := range []int32{80, 81} {
		for _, proto := range protocols {
			n := fmt.Sprintf("serve-%d-%s", port, strings.ToLower(string(proto)))
			p.Spec.Containers = append(p.Spec.Containers, v1.Container{Name: "c" + n[5:],
				Ports: []v1.ContainerPort{{Name: n, ContainerPort: port, Protocol: proto}}})
		}
	}
	return p
}

// newModelCluster is the e2e model with no policy, on both families.
func newModelCluster() *cluster {
	c := newCluster([]string{"n1", "n2"}, nil)
	for _, ns := range modelNamespaces {
		c.setNamespace(modelNamespace(ns))
		for _, name := range modelPods {
			c.setPod(modelPod(ns, name))
		}
	}
	return c
}

func podKey(ns, name string) types.NamespacedName {
	return types.NamespacedName{Namespace: ns, Name: name}
}

// Policy builders: short enough that a case reads like its YAML.

func policy(ns, name string, spec netv1.NetworkPolicySpec) *netv1.NetworkPolicy {
	return &netv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec}
}

// sel is a matchLabels selector of key=value pairs.
func sel(kv ...string) *metav1.LabelSelector {
	s := &metav1.LabelSelector{MatchLabels: map[string]string{}}
	for i := 0; i+1 < len(kv); i += 2 {
		s.MatchLabels[kv[i]] = kv[i+1]
	}
	return s
}

func exprSel(key string, op metav1.LabelSelectorOperator, values ...string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: key, Operator: op, Values: values}}}
}

func podPeer(s *metav1.LabelSelector) netv1.NetworkPolicyPeer {
	return netv1.NetworkPolicyPeer{PodSelector: s}
}

func nsPeer(s *metav1.LabelSelector) netv1.NetworkPolicyPeer {
	return netv1.NetworkPolicyPeer{NamespaceSelector: s}
}

func bothPeer(ns, pods *metav1.LabelSelector) netv1.NetworkPolicyPeer {
	return netv1.NetworkPolicyPeer{NamespaceSelector: ns, PodSelector: pods}
}

func blockPeer(cidr string, except ...string) netv1.NetworkPolicyPeer {
	return netv1.NetworkPolicyPeer{IPBlock: &netv1.IPBlock{CIDR: cidr, Except: except}}
}

func port(proto v1.Protocol, n int32) netv1.NetworkPolicyPort {
	p := intstr.FromInt32(n)
	return netv1.NetworkPolicyPort{Protocol: &proto, Port: &p}
}

func portRange(proto v1.Protocol, from, to int32) netv1.NetworkPolicyPort {
	p := port(proto, from)
	p.EndPort = &to
	return p
}

func namedPort(proto v1.Protocol, name string) netv1.NetworkPolicyPort {
	p := intstr.FromString(name)
	return netv1.NetworkPolicyPort{Protocol: &proto, Port: &p}
}

func ingress(peers []netv1.NetworkPolicyPeer, ports ...netv1.NetworkPolicyPort) netv1.NetworkPolicyIngressRule {
	return netv1.NetworkPolicyIngressRule{From: peers, Ports: ports}
}

func egress(peers []netv1.NetworkPolicyPeer, ports ...netv1.NetworkPolicyPort) netv1.NetworkPolicyEgressRule {
	return netv1.NetworkPolicyEgressRule{To: peers, Ports: ports}
}

func peers(p ...netv1.NetworkPolicyPeer) []netv1.NetworkPolicyPeer { return p }

var (
	ingressOnly = []netv1.PolicyType{netv1.PolicyTypeIngress}
	egressOnly  = []netv1.PolicyType{netv1.PolicyTypeEgress}
	bothTypes   = []netv1.PolicyType{netv1.PolicyTypeIngress, netv1.PolicyTypeEgress}
)
