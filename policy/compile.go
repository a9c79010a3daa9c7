package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"go4.org/netipx"
	v1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/netplane/netplane/nodeview"
)

// Policy is a NetworkPolicy compiled: selectors parsed, defaults applied,
// ipBlocks reduced to address ranges. Immutable once made.
type Policy struct {
	Namespace, Name string
	PodSelector     labels.Selector // the pods it applies to, in Namespace
	// Ingress and Egress are the policyTypes, defaults applied.
	Ingress, Egress bool
	IngressRules    []PolicyRule
	EgressRules     []PolicyRule
}

// Key is the policy's namespace and name.
func (p *Policy) Key() types.NamespacedName {
	return types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
}

// PolicyRule is one element of a policy's ingress or egress list.
type PolicyRule struct {
	Peers []Peer // nil: every peer, inside the cluster or not
	Ports []Port // nil: every port and protocol
}

// Peer is one element of a rule's from or to list: pods (Pods set) or an
// address block (Block set).
type Peer struct {
	Pods  *PeerSelector
	Block *Block
}

// PeerSelector selects pods by their namespace and labels.
type PeerSelector struct {
	// Namespace is the policy's namespace, which the pods must be in when
	// Namespaces is nil.
	Namespace  string
	Namespaces labels.Selector
	Pods       labels.Selector
	// Key is the canonical form: equal keys select the same pods, so
	// policies share the selector's sets.
	Key string
}

// Block is an ipBlock: CIDR less its exceptions, as address ranges.
type Block struct {
	Family nodeview.Family
	Ranges []netipx.IPRange
	Key    string // canonical form, shared like PeerSelector.Key
}

// Port is one element of a rule's ports list.
type Port struct {
	Protocol uint8
	// Port..EndPort is the range; 0 for every port of the protocol.
	Port, EndPort uint16
	Name          string // a named port: resolved per destination pod
}

// allPods selects every pod of every namespace: the destinations of an
// egress rule with a named port and no `to`.
var allPods = newPeerSelector("", labels.Everything(), labels.Everything())

func newPeerSelector(ns string, nss, pods labels.Selector) *PeerSelector {
	s := &PeerSelector{Namespace: ns, Namespaces: nss, Pods: pods}
	if nss == nil {
		s.Key = "ns=" + ns + ";pods=" + selectorKey(pods)
	} else {
		s.Key = "nss=" + selectorKey(nss) + ";pods=" + selectorKey(pods)
	}
	return s
}

// selectorKey is a selector's requirements in a canonical order (the
// selector sorts them by key only).
func selectorKey(s labels.Selector) string {
	reqs, _ := s.Requirements()
	parts := make([]string, len(reqs))
	for i := range reqs {
		parts[i] = reqs[i].String()
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}

// Compile turns an API NetworkPolicy into a Policy. Invalid content (which
// the API server's validation normally keeps out) is an error naming the
// field; the caller keeps what it had.
func Compile(np *netv1.NetworkPolicy) (*Policy, error) {
	sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
	if err != nil {
		return nil, fmt.Errorf("NetworkPolicy %s/%s: spec.podSelector: %w", np.Namespace, np.Name, err)
	}
	p := &Policy{Namespace: np.Namespace, Name: np.Name, PodSelector: sel}
	if len(np.Spec.PolicyTypes) == 0 {
		p.Ingress, p.Egress = true, len(np.Spec.Egress) > 0
	}
	for _, t := range np.Spec.PolicyTypes {
		switch t {
		case netv1.PolicyTypeIngress:
			p.Ingress = true
		case netv1.PolicyTypeEgress:
			p.Egress = true
		default:
			return nil, fmt.Errorf("NetworkPolicy %s/%s: spec.policyTypes: unknown type %q", np.Namespace, np.Name, t)
		}
	}
	for i, r := range np.Spec.Ingress {
		rule, err := compileRule(np.Namespace, "from", r.From, r.Ports)
		if err != nil {
			return nil, fmt.Errorf("NetworkPolicy %s/%s: spec.ingress[%d].%w", np.Namespace, np.Name, i, err)
		}
		p.IngressRules = append(p.IngressRules, rule)
	}
	for i, r := range np.Spec.Egress {
		rule, err := compileRule(np.Namespace, "to", r.To, r.Ports)
		if err != nil {
			return nil, fmt.Errorf("NetworkPolicy %s/%s: spec.egress[%d].%w", np.Namespace, np.Name, i, err)
		}
		p.EgressRules = append(p.EgressRules, rule)
	}
	return p, nil
}

func compileRule(ns, peerField string, peers []netv1.NetworkPolicyPeer, ports []netv1.NetworkPolicyPort) (PolicyRule, error) {
	var r PolicyRule
	for i, peer := range peers {
		p, err := compilePeer(ns, peer)
		if err != nil {
			return r, fmt.Errorf("%s[%d].%w", peerField, i, err)
		}
		r.Peers = append(r.Peers, p)
	}
	for i, port := range ports {
		p, err := compilePort(port)
		if err != nil {
			return r, fmt.Errorf("ports[%d].%w", i, err)
		}
		r.Ports = append(r.Ports, p)
	}
	return r, nil
}

func compilePeer(ns string, peer netv1.NetworkPolicyPeer) (Peer, error) {
	if b := peer.IPBlock; b != nil {
		if peer.PodSelector != nil || peer.NamespaceSelector != nil {
			return Peer{}, fmt.Errorf("ipBlock: cannot be combined with a selector in one peer")
		}
		block, err := compileBlock(b)
		return Peer{Block: block}, err
	}
	if peer.PodSelector == nil && peer.NamespaceSelector == nil {
		return Peer{}, fmt.Errorf("podSelector: a peer needs a podSelector, a namespaceSelector or an ipBlock")
	}
	pods := labels.Everything()
	if peer.PodSelector != nil {
		var err error
		if pods, err = metav1.LabelSelectorAsSelector(peer.PodSelector); err != nil {
			return Peer{}, fmt.Errorf("podSelector: %w", err)
		}
	}
	var nss labels.Selector
	if peer.NamespaceSelector != nil {
		var err error
		if nss, err = metav1.LabelSelectorAsSelector(peer.NamespaceSelector); err != nil {
			return Peer{}, fmt.Errorf("namespaceSelector: %w", err)
		}
		ns = ""
	}
	return Peer{Pods: newPeerSelector(ns, nss, pods)}, nil
}

func compileBlock(b *netv1.IPBlock) (*Block, error) {
	cidr, err := netip.ParsePrefix(strings.TrimSpace(b.CIDR))
	if err != nil {
		return nil, fmt.Errorf("ipBlock.cidr: %q is not a CIDR", b.CIDR)
	}
	cidr = cidr.Masked()
	var sb netipx.IPSetBuilder
	sb.AddPrefix(cidr)
	excepts := make([]string, 0, len(b.Except))
	for i, e := range b.Except {
		p, err := netip.ParsePrefix(strings.TrimSpace(e))
		if err != nil || p.Addr().Is4() != cidr.Addr().Is4() {
			return nil, fmt.Errorf("ipBlock.except[%d]: %q is not a CIDR of the family of %s", i, e, cidr)
		}
		sb.RemovePrefix(p.Masked())
		excepts = append(excepts, p.Masked().String())
	}
	set, err := sb.IPSet()
	if err != nil {
		return nil, fmt.Errorf("ipBlock: %w", err)
	}
	slices.Sort(excepts)
	excepts = slices.Compact(excepts)
	fam := nodeview.IPv4
	if cidr.Addr().Is6() {
		fam = nodeview.IPv6
	}
	return &Block{Family: fam, Ranges: set.Ranges(), Key: cidr.String() + " except " + strings.Join(excepts, ",")}, nil
}

func compilePort(p netv1.NetworkPolicyPort) (Port, error) {
	proto := v1.ProtocolTCP
	if p.Protocol != nil {
		proto = *p.Protocol
	}
	n, ok := protocolNumber(proto)
	if !ok {
		return Port{}, fmt.Errorf("protocol: %q is not TCP, UDP or SCTP", proto)
	}
	out := Port{Protocol: n}
	switch {
	case p.Port == nil:
		if p.EndPort != nil {
			return out, fmt.Errorf("endPort: needs a numeric port")
		}
	case p.Port.Type == intstr.String:
		if p.EndPort != nil {
			return out, fmt.Errorf("endPort: needs a numeric port, not the named port %q", p.Port.StrVal)
		}
		if p.Port.StrVal == "" {
			return out, fmt.Errorf("port: empty name")
		}
		out.Name = p.Port.StrVal
	default:
		if p.Port.IntVal < 1 || p.Port.IntVal > 65535 {
			return out, fmt.Errorf("port: %d is not in 1-65535", p.Port.IntVal)
		}
		out.Port, out.EndPort = uint16(p.Port.IntVal), uint16(p.Port.IntVal)
		if p.EndPort != nil {
			if *p.EndPort < p.Port.IntVal || *p.EndPort > 65535 {
				return out, fmt.Errorf("endPort: %d is not in %d-65535", *p.EndPort, p.Port.IntVal)
			}
			out.EndPort = uint16(*p.EndPort)
		}
	}
	return out, nil
}
