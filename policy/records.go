// Package policy enforces networking.k8s.io/v1 NetworkPolicy, and the Admin
// and Baseline tiers of policy.networking.k8s.io ClusterNetworkPolicy
// around it, for the pods of one node, in the nftables table `inet
// netplane-policy`. Its core is
// pure: slim records of pods, namespaces and policies, and an incremental
// Model that turns them into the table's desired content (chains, named
// sets and verdict maps, element by element) and reports what changed
// since it was last asked, so a sync programs only that; it knows no
// kernel and no API server, and is tested without either. Around it, the
// node role's feature (feature.go): informer sinks feeding the model,
// the rendering onto the nft driver (render.go), the sync loop, metrics
// and the denied-connection log. SEMANTICS.md says what is enforced where,
// README.md how it is built.
package policy

import (
	"net/netip"
	"strings"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/netplane/netplane/internal/intern"
)

// Pod is what policy needs of a pod. Records are never changed once made:
// an update is a new record.
type Pod struct {
	Namespace, Name string
	Node            string
	Labels          map[string]string
	labels          *shared[map[string]string] // holds Labels' shared map, when shared
	IPs             []netip.Addr               // status.podIPs
	HostNetwork     bool
	// Terminal: phase Succeeded or Failed. Such a pod's address may already
	// be another pod's, so it is neither a peer nor enforced.
	Terminal bool
	Ports    []NamedPort          // named container ports only
	ports    *shared[[]NamedPort] // holds Ports' shared list, when shared
}

// NamedPort is a named container port: what a policy's named port
// resolves to on this pod.
type NamedPort struct {
	Name     string
	Protocol uint8 // unix.IPPROTO_TCP, _UDP or _SCTP
	Port     uint16
}

// Namespace is what policy needs of a namespace.
type Namespace struct {
	Name   string
	Labels map[string]string
}

// Key is the pod's namespace and name.
func (p *Pod) Key() types.NamespacedName {
	return types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
}

// GetObjectMeta is the record's key, for the informer layer.
func (p *Pod) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}
}

// GetObjectMeta is the record's key, for the informer layer.
func (n *Namespace) GetObjectMeta() metav1.Object { return &metav1.ObjectMeta{Name: n.Name} }

// active: the pod has an address that is its own, so it can be a peer
// and, on its node, be enforced. hostNetwork pods use their node's address
// and are neither (SEMANTICS.md).
func (p *Pod) active() bool {
	return !p.HostNetwork && !p.Terminal && len(p.IPs) > 0
}

// PodFromAPI reduces an API pod to its record.
func PodFromAPI(p *v1.Pod) *Pod {
	r := &Pod{
		// One copy of each namespace's and node's name for all their pods.
		Namespace:   intern.String(p.Namespace),
		Name:        p.Name,
		Node:        intern.String(p.Spec.NodeName),
		HostNetwork: p.Spec.HostNetwork,
		Terminal:    p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed,
	}
	for _, ip := range p.Status.PodIPs {
		if a, err := netip.ParseAddr(strings.TrimSpace(ip.IP)); err == nil {
			r.IPs = append(r.IPs, a.Unmap())
		}
	}
	if len(r.IPs) == 0 && p.Status.PodIP != "" {
		if a, err := netip.ParseAddr(p.Status.PodIP); err == nil {
			r.IPs = append(r.IPs, a.Unmap())
		}
	}
	if r.labels = shareLabels(p.Labels); r.labels != nil {
		r.Labels = r.labels.v
	}
	ports := appendNamedPorts(nil, p.Spec.Containers)
	for _, c := range p.Spec.InitContainers {
		// Sidecars (restartable init containers) serve like containers.
		if c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways {
			ports = appendNamedPorts(ports, []v1.Container{c})
		}
	}
	if r.ports = sharePorts(ports); r.ports != nil {
		r.Ports = r.ports.v
	}
	return r
}

func appendNamedPorts(out []NamedPort, cs []v1.Container) []NamedPort {
	for _, c := range cs {
		for _, p := range c.Ports {
			proto, ok := protocolNumber(p.Protocol)
			if p.Name == "" || !ok || p.ContainerPort <= 0 || p.ContainerPort > 65535 {
				continue
			}
			out = append(out, NamedPort{Name: p.Name, Protocol: proto, Port: uint16(p.ContainerPort)})
		}
	}
	return out
}

// NamespaceFromAPI reduces an API namespace to its record.
func NamespaceFromAPI(ns *v1.Namespace) *Namespace {
	return &Namespace{Name: ns.Name, Labels: ns.Labels}
}

// protocolNumber is the IP protocol of an API protocol, TCP when empty.
func protocolNumber(p v1.Protocol) (uint8, bool) {
	switch p {
	case v1.ProtocolTCP, "":
		return unix.IPPROTO_TCP, true
	case v1.ProtocolUDP:
		return unix.IPPROTO_UDP, true
	case v1.ProtocolSCTP:
		return unix.IPPROTO_SCTP, true
	}
	return 0, false
}
