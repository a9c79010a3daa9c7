// Package scale fills a real API server with a cluster of a given size
// (Nodes, Pods with their statuses, Services with their EndpointSlices,
// NetworkPolicies), written directly with no kubelet or controller, for
// benchmarks that run one netplane node role against it.
package scale

import (
	"fmt"
	"net/netip"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// Sizes is the shape of a cluster.
type Sizes struct {
	Nodes, Pods, Services, Policies, Namespaces int
	// Big is how many ClusterIP Services, and Headless how many headless
	// ones, have BigEndpoints endpoints each (spread over slices of 100,
	// as kube-controller-manager writes them); the other Services share
	// the remaining pods.
	Big, Headless, BigEndpoints int
}

// Field is Kubernetes' published limits (sig-scalability thresholds.md):
// 5,000 nodes, 150,000 pods, 10,000 Services, 250 endpoints per Service,
// and 10,000 NetworkPolicies.
var Field = Sizes{Nodes: 5000, Pods: 150000, Services: 10000, Policies: 10000, Namespaces: 100, Big: 100, Headless: 50, BigEndpoints: 250}

// Tenth is Field at a tenth of its Nodes, Pods, Services and policies.
var Tenth = Sizes{Nodes: 500, Pods: 15000, Services: 1000, Policies: 1000, Namespaces: 10, Big: 10, Headless: 5, BigEndpoints: 250}

// The cluster's addresses: Node i is 192.168.(i/250).(i%250+2) with pod
// CIDR 10.(i/256).(i%256).0/24, all inside ClusterCIDR; Services get theirs
// from the API server's range.
const (
	ClusterCIDR = "10.0.0.0/11"
	NodeSubnet  = "192.168.0.0/16"
)

// NodeName is Node i's name; Node 0 is the one the benchmark runs.
func NodeName(i int) string { return fmt.Sprintf("node-%d", i) }

// NodeIP is Node i's InternalIP.
func NodeIP(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{192, 168, byte(i / 250), byte(i%250 + 2)})
}

// PodCIDR is Node i's pod CIDR.
func PodCIDR(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i / 256), byte(i % 256), 0}), 24)
}

// PodIP is the address of the slot-th pod on Node i (slot < 250).
func PodIP(node, slot int) netip.Addr {
	a := PodCIDR(node).Addr().As4()
	a[3] = byte(slot + 2)
	return netip.AddrFrom4(a)
}

// Namespace is namespace i's name. Odd namespaces are labelled env=prod,
// and every namespace team=team-(i%10): the policies' namespace selectors
// pick among them.
func Namespace(i int) string { return fmt.Sprintf("ns-%d", i) }

// Namespaces are the cluster's namespaces.
func (s Sizes) NamespaceObjects() []*v1.Namespace {
	out := make([]*v1.Namespace, s.Namespaces)
	for i := range out {
		env := map[bool]string{false: "dev", true: "prod"}[i%2 == 1]
		out[i] = &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace(i),
			Labels: map[string]string{"team": fmt.Sprintf("team-%d", i%10), "env": env}}}
	}
	return out
}

// Node is Node i, with its address and pod CIDR.
func (s Sizes) Node(i int) *v1.Node {
	return &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: NodeName(i), Labels: map[string]string{
			"kubernetes.io/hostname": NodeName(i), "topology.kubernetes.io/zone": fmt.Sprintf("zone-%d", i%3)}},
		Spec: v1.NodeSpec{PodCIDR: PodCIDR(i).String(), PodCIDRs: []string{PodCIDR(i).String()}},
		Status: v1.NodeStatus{
			Addresses:  []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: NodeIP(i).String()}, {Type: v1.NodeHostName, Address: NodeName(i)}},
			Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue, LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}},
		},
	}
}

// podsPerNode is how many pods each Node runs (pods are dealt round the
// Nodes, so each Service's pods are spread over many of them).
func (s Sizes) podsPerNode() int { return (s.Pods + s.Nodes - 1) / s.Nodes }

// podPlace is pod j's Node and slot on it.
func (s Sizes) podPlace(j int) (node, slot int) { return j % s.Nodes, j / s.Nodes }

// serviceOf is the Service whose endpoint pod j is: the Big and Headless
// Services take BigEndpoints pods each, in order; the rest are dealt round
// the other Services.
func (s Sizes) serviceOf(j int) int {
	big := (s.Big + s.Headless) * s.BigEndpoints
	if j < big {
		return j / s.BigEndpoints
	}
	rest := s.Services - s.Big - s.Headless
	return s.Big + s.Headless + (j-big)%rest
}

// ServiceName is Service k's name; it lives in namespace k % Namespaces.
func (s Sizes) ServiceName(k int) string { return fmt.Sprintf("svc-%d", k) }

// ServiceNamespace is Service k's namespace.
func (s Sizes) ServiceNamespace(k int) string { return Namespace(k % s.Namespaces) }

// PodName is pod j's name; it lives in its Service's namespace.
func (s Sizes) PodName(j int) string { return fmt.Sprintf("pod-%d", j) }

// Pod is pod j, Running and Ready on its Node, with the labels of its
// Service (app=svc-k) and a tier; its status is written by UpdateStatus.
func (s Sizes) Pod(j int) *v1.Pod {
	node, slot := s.podPlace(j)
	k := s.serviceOf(j)
	ip := PodIP(node, slot).String()
	start := metav1.Now()
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.ServiceNamespace(k), Name: s.PodName(j),
			Labels: map[string]string{"app": s.ServiceName(k), "tier": []string{"fe", "be", "db"}[j%3], "pod-template-hash": fmt.Sprintf("h%d", k%97)}},
		Spec: v1.PodSpec{NodeName: NodeName(node), Containers: []v1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10",
			Ports: []v1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: v1.ProtocolTCP}, {Name: "metrics", ContainerPort: 9090, Protocol: v1.ProtocolTCP}}}}},
		Status: v1.PodStatus{Phase: v1.PodRunning, HostIP: NodeIP(node).String(), HostIPs: []v1.HostIP{{IP: NodeIP(node).String()}},
			PodIP: ip, PodIPs: []v1.PodIP{{IP: ip}}, StartTime: &start,
			Conditions: []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionTrue, LastTransitionTime: start},
				{Type: v1.ContainersReady, Status: v1.ConditionTrue, LastTransitionTime: start},
				{Type: v1.PodScheduled, Status: v1.ConditionTrue, LastTransitionTime: start}},
			ContainerStatuses: []v1.ContainerStatus{{Name: "app", Ready: true, Started: ptr.To(true), Image: "registry.k8s.io/pause:3.10",
				ContainerID: fmt.Sprintf("containerd://%064x", j), State: v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: start}}}}},
	}
}

// Service is Service k: port 80 to the pods' "http", headless for the
// Headless ones after the Big.
func (s Sizes) Service(k int) *v1.Service {
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: s.ServiceNamespace(k), Name: s.ServiceName(k)},
		Spec: v1.ServiceSpec{Selector: map[string]string{"app": s.ServiceName(k)},
			Ports: []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromString("http")}}}}
	if k >= s.Big && k < s.Big+s.Headless {
		svc.Spec.ClusterIP = v1.ClusterIPNone
	}
	return svc
}

// Endpoint is one pod behind a Service.
type Endpoint struct {
	Pod  string
	IP   netip.Addr
	Node int
}

// Endpoints are each Service's endpoints, in pod order.
func (s Sizes) Endpoints() [][]Endpoint {
	out := make([][]Endpoint, s.Services)
	for j := range s.Pods {
		node, slot := s.podPlace(j)
		k := s.serviceOf(j)
		out[k] = append(out[k], Endpoint{Pod: s.PodName(j), IP: PodIP(node, slot), Node: node})
	}
	return out
}

// Slices are Service k's EndpointSlices, 100 endpoints each.
func (s Sizes) Slices(k int, eps []Endpoint) []*discovery.EndpointSlice {
	var out []*discovery.EndpointSlice
	for i := 0; i == 0 || i < len(eps); i += 100 {
		out = append(out, s.Slice(k, i/100, eps[i:min(i+100, len(eps))]))
	}
	return out
}

// Slice is slice n of Service k, holding eps.
func (s Sizes) Slice(k, n int, eps []Endpoint) *discovery.EndpointSlice {
	ns, name := s.ServiceNamespace(k), s.ServiceName(k)
	sl := &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("%s-%d", name, n),
			Labels: map[string]string{discovery.LabelServiceName: name, discovery.LabelManagedBy: "endpointslice-controller.k8s.io"}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(v1.ProtocolTCP), Port: ptr.To[int32](8080)}},
	}
	for _, e := range eps {
		sl.Endpoints = append(sl.Endpoints, discovery.Endpoint{Addresses: []string{e.IP.String()}, NodeName: ptr.To(NodeName(e.Node)),
			Zone:       ptr.To(fmt.Sprintf("zone-%d", e.Node%3)),
			TargetRef:  &v1.ObjectReference{Kind: "Pod", Namespace: ns, Name: e.Pod},
			Conditions: discovery.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)}})
	}
	return sl
}
