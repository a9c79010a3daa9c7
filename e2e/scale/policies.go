package scale

import (
	"fmt"

	v1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// PolicyName is the name of namespace i's k-th NetworkPolicy.
func PolicyName(k int) string { return fmt.Sprintf("np-%d", k) }

// PolicyObjects are the cluster's NetworkPolicies, Policies/Namespaces in
// each namespace, in the shapes clusters use: a default deny both ways,
// same-namespace ingress, DNS egress, egress to any pod's "http" port,
// egress to the outside but private ranges, and then one policy per
// Service of the namespace: ingress to its pods from the front-ends of
// the namespaces of one team or from any env=prod namespace on "http",
// and from ns-1 on a port range.
func (s Sizes) PolicyObjects() []*netv1.NetworkPolicy {
	per := s.Policies / s.Namespaces
	out := make([]*netv1.NetworkPolicy, 0, s.Policies)
	for i := range s.Namespaces {
		for k := range per {
			out = append(out, s.Policy(i, k))
		}
	}
	return out
}

// Policy is namespace i's k-th NetworkPolicy.
func (s Sizes) Policy(i, k int) *netv1.NetworkPolicy {
	both := []netv1.PolicyType{netv1.PolicyTypeIngress, netv1.PolicyTypeEgress}
	egressOnly := []netv1.PolicyType{netv1.PolicyTypeEgress}
	var spec netv1.NetworkPolicySpec
	switch k {
	case 0:
		spec = netv1.NetworkPolicySpec{PolicyTypes: both}
	case 1:
		spec = netv1.NetworkPolicySpec{Ingress: []netv1.NetworkPolicyIngressRule{{From: []netv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}}}}}
	case 2:
		spec = netv1.NetworkPolicySpec{PolicyTypes: egressOnly, Egress: []netv1.NetworkPolicyEgressRule{{
			To:    []netv1.NetworkPolicyPeer{{NamespaceSelector: labels("kubernetes.io/metadata.name", "kube-system"), PodSelector: labels("k8s-app", "kube-dns")}},
			Ports: []netv1.NetworkPolicyPort{{Protocol: ptr.To(v1.ProtocolUDP), Port: ptr.To(intstr.FromInt32(53))}}}}}
	case 3:
		spec = netv1.NetworkPolicySpec{PolicyTypes: egressOnly,
			PodSelector: metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpIn, Values: []string{"fe", "be"}}}},
			Egress: []netv1.NetworkPolicyEgressRule{{To: []netv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}}},
				Ports: []netv1.NetworkPolicyPort{{Protocol: ptr.To(v1.ProtocolTCP), Port: ptr.To(intstr.FromString("http"))}}}}}
	case 4:
		spec = netv1.NetworkPolicySpec{PolicyTypes: egressOnly, PodSelector: *labels("tier", "fe"),
			Egress: []netv1.NetworkPolicyEgressRule{{To: []netv1.NetworkPolicyPeer{{IPBlock: &netv1.IPBlock{CIDR: "0.0.0.0/0",
				Except: []string{"10.0.0.0/8", "172.16.0.0/12", fmt.Sprintf("192.168.%d.0/24", i%256)}}}},
				Ports: []netv1.NetworkPolicyPort{{Protocol: ptr.To(v1.ProtocolTCP), Port: ptr.To(intstr.FromInt32(443))}}}}}
	default:
		spec = s.servicePolicy(i, k-5)
	}
	return &netv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace(i), Name: PolicyName(k)}, Spec: spec}
}

// servicePolicy guards the n-th Service of namespace i.
func (s Sizes) servicePolicy(i, n int) netv1.NetworkPolicySpec {
	app := s.ServiceName(i + n*s.Namespaces)
	return netv1.NetworkPolicySpec{PodSelector: *labels("app", app), Ingress: []netv1.NetworkPolicyIngressRule{
		{From: []netv1.NetworkPolicyPeer{
			{NamespaceSelector: labels("team", fmt.Sprintf("team-%d", (i+n)%10)), PodSelector: labels("tier", "fe")},
			{NamespaceSelector: labels("env", "prod")}},
			Ports: []netv1.NetworkPolicyPort{{Protocol: ptr.To(v1.ProtocolTCP), Port: ptr.To(intstr.FromString("http"))}}},
		{From: []netv1.NetworkPolicyPeer{{NamespaceSelector: labels("kubernetes.io/metadata.name", Namespace(1))}},
			Ports: []netv1.NetworkPolicyPort{{Protocol: ptr.To(v1.ProtocolTCP), Port: ptr.To(intstr.FromInt32(9000)), EndPort: ptr.To[int32](9100)}}},
	}}
}

// WithBlock is policy p with one more ingress rule from cidr on port 8080:
// a change whose arrival in the kernel a benchmark can see (the prefix's
// address is in the notification).
func WithBlock(p *netv1.NetworkPolicy, cidr string) *netv1.NetworkPolicy {
	p = p.DeepCopy()
	p.Spec.Ingress = append(p.Spec.Ingress, netv1.NetworkPolicyIngressRule{
		From:  []netv1.NetworkPolicyPeer{{IPBlock: &netv1.IPBlock{CIDR: cidr}}},
		Ports: []netv1.NetworkPolicyPort{{Protocol: ptr.To(v1.ProtocolTCP), Port: ptr.To(intstr.FromInt32(8080))}}})
	return p
}

func labels(k, v string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchLabels: map[string]string{k: v}}
}
