package policy

import (
	"fmt"
	"net/netip"
	"slices"

	"go4.org/netipx"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
)

// ClusterVerdict is the rule of a ClusterNetworkPolicy tier that decides
// one direction of a connection; Action is 0 when no rule of the tier
// matches it.
type ClusterVerdict struct {
	Tier     Tier
	Policy   string
	Rule     int // in the policy's ingress or egress list
	RuleName string
	Action   Action
}

func (v ClusterVerdict) String() string {
	if v.Action == 0 {
		return v.Tier.String() + ": no rule matches"
	}
	name := ""
	if v.RuleName != "" {
		name = fmt.Sprintf(" (%q)", v.RuleName)
	}
	return fmt.Sprintf("%s: ClusterNetworkPolicy %s, rule %d%s: %s", v.Tier, v.Policy, v.Rule, name, v.Action)
}

// Flow is one direction of a connection as a tier judges it: Pod is the
// pod whose policies count (the source for egress, the destination for
// ingress), Peer the address at the other end, Proto and Port the
// destination's.
type Flow struct {
	Dir   Direction
	Pod   types.NamespacedName
	Peer  netip.Addr
	Proto uint8
	Port  uint16
}

// TraceCluster says which rule decides the flow in the Admin and in the
// Baseline tier, read from the compiled policies and the records in the
// model (the same ones its table is made of), not from the table: what
// `netplane explain` names. A tier whose deciding rule is Pass, or where
// none matches, hands the flow to the next one; the caller combines them
// with NetworkPolicy's answer (Admin, then NetworkPolicy when it isolates
// the pod, then Baseline, then allowed).
func (m *Model) TraceCluster(f Flow) (admin, baseline ClusterVerdict) {
	admin.Tier, baseline.Tier = AdminTier, BaselineTier
	p := m.pods[f.Pod]
	if m.cl == nil || p == nil || !p.rec.active() {
		return admin, baseline
	}
	out := [2]*ClusterVerdict{&admin, &baseline}
	nl := labelsOf(p.ns)
	for _, st := range m.cl.order {
		v := out[st.rec.Tier]
		if v.Action != 0 || !st.rec.subjectSelects(nl, p.labels()) {
			continue
		}
		for _, r := range st.rec.Rules[f.Dir] {
			if m.ruleMatches(r, p.rec, f) {
				*v = ClusterVerdict{Tier: st.rec.Tier, Policy: st.rec.Name, Rule: r.Index, RuleName: r.Name, Action: r.Action}
				break
			}
		}
	}
	return admin, baseline
}

// ruleMatches: some peer of r is f's peer, on a port of r.
func (m *Model) ruleMatches(r ClusterRule, self *Pod, f Flow) bool {
	if len(r.Peers) == 0 {
		return true // failed closed: every connection
	}
	if !m.family(f.Peer) {
		return false // the table has no rule of this family
	}
	for _, peer := range r.Peers {
		switch {
		case peer.Block != nil:
			if slices.ContainsFunc(peer.Block.Ranges, func(rg netipx.IPRange) bool { return rg.Contains(f.Peer) }) &&
				clusterPortsMatch(r.Ports, f, nil, self) {
				return true
			}
		case peer.Nodes != nil:
			for _, n := range m.cl.nodes {
				if slices.Contains(n.IPs, f.Peer) && peer.Nodes.Labels.Matches(labels.Set(n.Labels)) && clusterPortsMatch(r.Ports, f, nil, self) {
					return true
				}
			}
		default:
			for _, q := range m.pods {
				if q.rec.active() && slices.Contains(q.rec.IPs, f.Peer) && peer.Pods.Namespaces.Matches(labelsOf(q.ns)) &&
					peer.Pods.Pods.Matches(q.labels()) && clusterPortsMatch(r.Ports, f, q.rec, self) {
					return true
				}
			}
		}
	}
	return false
}

// clusterPortsMatch: the flow's destination port is one of ports (none: any).
// A named port is the destination pod's: self for ingress, the peer pod
// for egress (nil for a peer that is no pod, which has none).
func clusterPortsMatch(ports []Port, f Flow, peer, self *Pod) bool {
	if len(ports) == 0 {
		return true
	}
	dst := self
	if f.Dir == Egress {
		dst = peer
	}
	for _, p := range ports {
		if p.Name == "" {
			if p.Protocol == f.Proto && f.Port >= p.Port && f.Port <= p.EndPort {
				return true
			}
			continue
		}
		if dst != nil && slices.Contains(dst.Ports, NamedPort{Name: p.Name, Protocol: f.Proto, Port: f.Port}) {
			return true
		}
	}
	return false
}
