package policy

import (
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
	netv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// This file compiles a ClusterNetworkPolicy (policy.networking.k8s.io,
// network-policy-api v0.3.0) into a ClusterPolicy: selectors parsed,
// networks reduced to address ranges, every rule's action and matches
// explicit. The API's validation keeps most bad content out; what is left
// (an unknown peer or protocol, seen as a peer with no field set, which a
// newer CRD than this build knows would give; a domain name peer, which
// netplane does not enforce) fails closed as the API says: an Accept rule
// matches nothing, a Deny or Pass rule denies everything. Problems names
// each such rule, for the Warning event.

// Tier is the tier of a ClusterNetworkPolicy: Admin is judged before
// NetworkPolicy, Baseline after.
type Tier uint8

const (
	AdminTier Tier = iota
	BaselineTier
)

func (t Tier) String() string {
	if t == BaselineTier {
		return "Baseline"
	}
	return "Admin"
}

// Action is what a ClusterNetworkPolicy rule does with what it matches.
type Action uint8

const (
	ActionAccept Action = iota + 1
	ActionDeny
	ActionPass
)

func (a Action) String() string {
	switch a {
	case ActionAccept:
		return "Accept"
	case ActionDeny:
		return "Deny"
	case ActionPass:
		return "Pass"
	}
	return ""
}

// ClusterPolicy is a ClusterNetworkPolicy compiled. Immutable once made.
type ClusterPolicy struct {
	Name     string
	Tier     Tier
	Priority int32
	// Subject: the pods of the namespaces Namespaces selects that Pods
	// (nil: every pod) selects.
	Namespaces, Pods labels.Selector
	Rules            [2][]ClusterRule // by Direction, in the policy's order
	// Problems are the rules that failed closed, and why.
	Problems []string
}

// ClusterRule is one rule of a ClusterNetworkPolicy.
type ClusterRule struct {
	Index  int // in the policy's ingress or egress list
	Name   string
	Action Action
	// Peers: the rule matches a connection whose peer is any of them; a
	// rule with none matches every peer (a Deny or Pass rule failed closed).
	Peers []ClusterPeer
	// Ports: nil for every port and protocol. A named port has Protocol 0:
	// the destination pod's port of that name, of whichever protocol.
	Ports []Port
	// Closed: the rule failed closed (Problems says why).
	Closed bool
}

// ClusterPeer is one peer of a rule: pods (Pods), addresses (Block), or
// the addresses of Nodes (Nodes).
type ClusterPeer struct {
	Pods  *PeerSelector
	Block *Block
	Nodes *NodeSelector
}

// NodeSelector selects Nodes by their labels; Key is its canonical form.
type NodeSelector struct {
	Labels labels.Selector
	Key    string
}

// CompileCluster turns an API ClusterNetworkPolicy into a ClusterPolicy.
// An error (an unknown tier, a subject with no field set, a subject
// selector that does not parse) means nothing of the policy can be
// enforced: the caller keeps what it had.
func CompileCluster(cnp *cnpv1.ClusterNetworkPolicy) (*ClusterPolicy, error) {
	p := &ClusterPolicy{Name: cnp.Name, Priority: cnp.Spec.Priority}
	switch cnp.Spec.Tier {
	case cnpv1.AdminTier:
		p.Tier = AdminTier
	case cnpv1.BaselineTier:
		p.Tier = BaselineTier
	default:
		return nil, fmt.Errorf("ClusterNetworkPolicy %s: spec.tier: unknown tier %q", cnp.Name, cnp.Spec.Tier)
	}
	var err error
	switch s := cnp.Spec.Subject; {
	case s.Namespaces != nil:
		p.Namespaces, err = metav1.LabelSelectorAsSelector(s.Namespaces)
	case s.Pods != nil:
		p.Namespaces, err = metav1.LabelSelectorAsSelector(&s.Pods.NamespaceSelector)
		if err == nil {
			p.Pods, err = metav1.LabelSelectorAsSelector(&s.Pods.PodSelector)
		}
	default:
		err = fmt.Errorf("no field this node knows is set")
	}
	if err != nil {
		return nil, fmt.Errorf("ClusterNetworkPolicy %s: spec.subject: %w", cnp.Name, err)
	}
	for i, r := range cnp.Spec.Ingress {
		peers := make([]cnpv1.ClusterNetworkPolicyEgressPeer, len(r.From))
		for j, f := range r.From {
			peers[j] = cnpv1.ClusterNetworkPolicyEgressPeer{Namespaces: f.Namespaces, Pods: f.Pods}
		}
		p.addRule(Ingress, i, r.Name, r.Action, peers, r.Protocols)
	}
	for i, r := range cnp.Spec.Egress {
		p.addRule(Egress, i, r.Name, r.Action, r.To, r.Protocols)
	}
	return p, nil
}

// addRule compiles one rule, failing it closed on what it cannot read.
func (p *ClusterPolicy) addRule(d Direction, i int, name string, action cnpv1.ClusterNetworkPolicyRuleAction,
	peers []cnpv1.ClusterNetworkPolicyEgressPeer, protocols []cnpv1.ClusterNetworkPolicyProtocol) {
	r := ClusterRule{Index: i, Name: name}
	field := fmt.Sprintf("spec.%s[%d]", d, i)
	var problem error
	switch action {
	case cnpv1.ClusterNetworkPolicyRuleActionAccept:
		r.Action = ActionAccept
	case cnpv1.ClusterNetworkPolicyRuleActionDeny:
		r.Action = ActionDeny
	case cnpv1.ClusterNetworkPolicyRuleActionPass:
		r.Action = ActionPass
	default:
		r.Action, problem = ActionDeny, fmt.Errorf("action: %q is no action this node knows", action)
	}
	peerField := "to"
	if d == Ingress {
		peerField = "from"
	}
	for j, peer := range peers {
		if problem != nil {
			break
		}
		var ps []ClusterPeer
		ps, problem = compileClusterPeer(peer)
		if problem != nil {
			problem = fmt.Errorf("%s[%d]%w", peerField, j, problem)
		}
		r.Peers = append(r.Peers, ps...)
	}
	if len(peers) == 0 && problem == nil {
		problem = fmt.Errorf("%s: no peer", peerField)
	}
	for j, proto := range protocols {
		if problem != nil {
			break
		}
		var port Port
		port, problem = compileProtocol(proto)
		if problem != nil {
			problem = fmt.Errorf("protocols[%d]%w", j, problem)
		}
		r.Ports = append(r.Ports, port)
	}
	if problem != nil {
		r.Closed, r.Peers, r.Ports = true, nil, nil
		what := "denies every connection"
		if r.Action == ActionAccept {
			what = "matches nothing"
		}
		p.Problems = append(p.Problems, fmt.Sprintf("%s.%v: the rule fails closed and %s", field, problem, what))
		if r.Action == ActionAccept {
			return
		}
		r.Action = ActionDeny
	}
	p.Rules[d] = append(p.Rules[d], r)
}

// compileClusterPeer: one API peer is one or more peers (a Networks list is
// a block per CIDR).
func compileClusterPeer(peer cnpv1.ClusterNetworkPolicyEgressPeer) ([]ClusterPeer, error) {
	set := 0
	for _, ok := range []bool{peer.Namespaces != nil, peer.Pods != nil, peer.Nodes != nil, len(peer.Networks) > 0, len(peer.DomainNames) > 0} {
		if ok {
			set++
		}
	}
	if set == 0 {
		return nil, fmt.Errorf(": no field this node knows is set: an unknown peer")
	}
	if set > 1 {
		return nil, fmt.Errorf(": %d fields set, not one", set)
	}
	switch {
	case peer.Namespaces != nil:
		nss, err := metav1.LabelSelectorAsSelector(peer.Namespaces)
		if err != nil {
			return nil, fmt.Errorf(".namespaces: %w", err)
		}
		return []ClusterPeer{{Pods: newPeerSelector("", nss, labels.Everything())}}, nil
	case peer.Pods != nil:
		nss, err := metav1.LabelSelectorAsSelector(&peer.Pods.NamespaceSelector)
		if err != nil {
			return nil, fmt.Errorf(".pods.namespaceSelector: %w", err)
		}
		pods, err := metav1.LabelSelectorAsSelector(&peer.Pods.PodSelector)
		if err != nil {
			return nil, fmt.Errorf(".pods.podSelector: %w", err)
		}
		return []ClusterPeer{{Pods: newPeerSelector("", nss, pods)}}, nil
	case peer.Nodes != nil:
		sel, err := metav1.LabelSelectorAsSelector(peer.Nodes)
		if err != nil {
			return nil, fmt.Errorf(".nodes: %w", err)
		}
		return []ClusterPeer{{Nodes: &NodeSelector{Labels: sel, Key: "nodes=" + selectorKey(sel)}}}, nil
	case len(peer.Networks) > 0:
		out := make([]ClusterPeer, 0, len(peer.Networks))
		for k, n := range peer.Networks {
			b, err := compileBlock(&netv1.IPBlock{CIDR: string(n)})
			if err != nil {
				return nil, fmt.Errorf(".networks[%d]: %q is not a CIDR", k, n)
			}
			out = append(out, ClusterPeer{Block: b})
		}
		return out, nil
	}
	return nil, fmt.Errorf(".domainNames: not enforced by netplane")
}

// compileProtocol: exactly one of the protocols or a named port.
func compileProtocol(p cnpv1.ClusterNetworkPolicyProtocol) (Port, error) {
	type known struct {
		proto uint8
		port  *cnpv1.Port
		name  string
	}
	var set []known
	if p.TCP != nil {
		set = append(set, known{unix.IPPROTO_TCP, p.TCP.DestinationPort, "tcp"})
	}
	if p.UDP != nil {
		set = append(set, known{unix.IPPROTO_UDP, p.UDP.DestinationPort, "udp"})
	}
	if p.SCTP != nil {
		set = append(set, known{unix.IPPROTO_SCTP, p.SCTP.DestinationPort, "sctp"})
	}
	if p.DestinationNamedPort != "" {
		if len(set) > 0 {
			return Port{}, fmt.Errorf(".destinationNamedPort: set with a protocol")
		}
		return Port{Name: p.DestinationNamedPort}, nil
	}
	if len(set) != 1 {
		return Port{}, fmt.Errorf(": %d fields this node knows are set, not one: an unknown protocol", len(set))
	}
	k := set[0]
	switch {
	case k.port == nil:
		return Port{}, fmt.Errorf(".%s: no field this node knows is set", k.name)
	case k.port.Range != nil && k.port.Number == 0:
		s, e := k.port.Range.Start, k.port.Range.End
		if s < 1 || e > 65535 || s > e {
			return Port{}, fmt.Errorf(".%s.destinationPort.range: %d-%d is not a range of ports", k.name, s, e)
		}
		return Port{Protocol: k.proto, Port: uint16(s), EndPort: uint16(e)}, nil
	case k.port.Range == nil && k.port.Number >= 1 && k.port.Number <= 65535:
		return Port{Protocol: k.proto, Port: uint16(k.port.Number), EndPort: uint16(k.port.Number)}, nil
	}
	return Port{}, fmt.Errorf(".%s.destinationPort: neither one port nor one range", k.name)
}

// clusterOrder sorts policies as they are judged within a tier: ascending
// priority; the API leaves the order of equal priorities to the
// implementation, and netplane takes the name's.
func clusterOrder(a, b *ClusterPolicy) int {
	if a.Priority != b.Priority {
		return int(a.Priority - b.Priority)
	}
	return strings.Compare(a.Name, b.Name)
}

// subjectSelects: the policy's subject holds a pod with these labels in a
// namespace with these.
func (p *ClusterPolicy) subjectSelects(ns, pod labels.Set) bool {
	return p.Namespaces.Matches(ns) && (p.Pods == nil || p.Pods.Matches(pod))
}
