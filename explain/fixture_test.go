package explain

import (
	"net/netip"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	netv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Objects for the core's tests: two nodes on one subnet, pods, Services,
// slices and policies built in a line each.

func node(name, ip, cidr, zone string) *v1.Node {
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}}}
	if zone != "" {
		n.Labels[v1.LabelTopologyZone] = zone
	}
	n.Spec.PodCIDR, n.Spec.PodCIDRs = cidr, []string{cidr}
	n.Status.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: ip}}
	return n
}

var testNodes = []*v1.Node{
	node("n1", "192.168.0.1", "10.244.1.0/24", "a"),
	node("n2", "192.168.0.2", "10.244.2.0/24", "b"),
}

func pod(ns, name, nodeName, ip string, labels map[string]string, ports ...v1.ContainerPort) *v1.Pod {
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}}
	p.Spec.NodeName = nodeName
	p.Spec.Containers = []v1.Container{{Name: "c", Image: "registry.invalid/none", Ports: ports}}
	p.Status.Phase = v1.PodRunning
	p.Status.PodIP = ip
	p.Status.PodIPs = []v1.PodIP{{IP: ip}}
	return p
}

func namespace(name string, labels map[string]string) *v1.Namespace {
	if labels == nil {
		labels = map[string]string{}
	}
	labels["kubernetes.io/metadata.name"] = name
	return &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

func service(ns, name, clusterIP string, ports ...v1.ServicePort) *v1.Service {
	s := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	s.Spec.Type = v1.ServiceTypeClusterIP
	s.Spec.ClusterIP, s.Spec.ClusterIPs = clusterIP, []string{clusterIP}
	s.Spec.Ports = ports
	return s
}

func svcPort(name string, port, target int32) v1.ServicePort {
	return v1.ServicePort{Name: name, Port: port, TargetPort: intstr.FromInt32(target), Protocol: v1.ProtocolTCP}
}

// ep is an endpoint: its pod, node and conditions.
type ep struct {
	p                           *v1.Pod
	ready, serving, terminating bool
}

func slice(svc *v1.Service, portName string, port int32, eps ...ep) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: svc.Namespace, Name: svc.Name + "-abc", Labels: map[string]string{discoveryv1.LabelServiceName: svc.Name}},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	proto := v1.ProtocolTCP
	s.Ports = []discoveryv1.EndpointPort{{Name: &portName, Port: &port, Protocol: &proto}}
	for _, e := range eps {
		ready, serving, term := e.ready, e.serving, e.terminating
		nodeName := e.p.Spec.NodeName
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{e.p.Status.PodIP},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &term},
			NodeName:   &nodeName,
			TargetRef:  &v1.ObjectReference{Kind: "Pod", Namespace: e.p.Namespace, Name: e.p.Name},
		})
	}
	return s
}

func ready(p *v1.Pod) ep { return ep{p: p, ready: true, serving: true} }

func netpol(ns, name string, selector map[string]string, types []netv1.PolicyType, ingress []netv1.NetworkPolicyIngressRule, egress []netv1.NetworkPolicyEgressRule) *netv1.NetworkPolicy {
	return &netv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: netv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: selector},
			PolicyTypes: types, Ingress: ingress, Egress: egress},
	}
}

func fromPods(labels map[string]string) netv1.NetworkPolicyPeer {
	return netv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: labels}}
}

func fromNamespaces(labels map[string]string) netv1.NetworkPolicyPeer {
	return netv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{MatchLabels: labels}}
}

func tcp(port intstr.IntOrString, end ...int32) netv1.NetworkPolicyPort {
	proto := v1.ProtocolTCP
	p := netv1.NetworkPolicyPort{Protocol: &proto, Port: &port}
	if len(end) > 0 {
		p.EndPort = &end[0]
	}
	return p
}

var (
	ingressOnly = []netv1.PolicyType{netv1.PolicyTypeIngress}
	egressOnly  = []netv1.PolicyType{netv1.PolicyTypeEgress}
)

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }
