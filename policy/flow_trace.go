package policy

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	"k8s.io/apimachinery/pkg/types"

	"github.com/netplane/netplane/nodeview"
)

// This file traces one direction of a connection through the model as the
// kernel runs the pod's chains: the Admin tier, NetworkPolicy, the Baseline
// tier. It reads the compiled rules the table's chains are made of (the
// items of each policy, named ports resolved on the pod as its group chain
// has them) and matches them with Table.match against the table's own sets
// (selector members, named-port sets, ipBlock ranges less their except),
// so it names the policy and rule behind the table's verdict and cannot
// judge otherwise: `netplane explain` prints it.

// Flow is one direction of a connection: Pod is the pod whose policies
// count (the source for egress, the destination for ingress), Peer the
// address at the other end, Proto and Port the destination's.
type Flow struct {
	Dir   Direction
	Pod   types.NamespacedName
	Peer  netip.Addr
	Proto uint8
	Port  uint16
}

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

// Isolation is a NetworkPolicy that isolates the pod in the flow's
// direction, and the first of its rules that allows the flow (-1: none).
type Isolation struct {
	Policy types.NamespacedName
	Rule   int
}

// Decision is how the model decides one direction of a flow. Admin and
// Baseline are each tier's deciding rule, whether or not the flow gets
// that far; Isolations are the NetworkPolicies selecting the pod, by name.
type Decision struct {
	// Enforced: the pod is this node's and its rules apply (it has an
	// address of its own, is no hostNetwork pod, has not finished).
	Enforced        bool
	Admin, Baseline ClusterVerdict
	Isolations      []Isolation
	Allowed         bool
}

// Isolated: a NetworkPolicy selects the pod in the flow's direction.
func (d Decision) Isolated() bool { return len(d.Isolations) > 0 }

// NetworkPolicyAllows: some isolating NetworkPolicy has a rule that
// allows the flow.
func (d Decision) NetworkPolicyAllows() bool {
	return slices.ContainsFunc(d.Isolations, func(i Isolation) bool { return i.Rule >= 0 })
}

// Trace decides f as the pod's chains do: an Admin Accept or Deny is
// final; else a NetworkPolicy isolating the pod decides (allowed when any
// of its rules allows); else a Baseline Accept, Pass or Deny; else the
// flow is allowed.
func (m *Model) Trace(f Flow) Decision {
	d := Decision{Allowed: true}
	d.Admin.Tier, d.Baseline.Tier = AdminTier, BaselineTier
	p := m.pod(f.Pod)
	if p == nil || p.enf == nil {
		return d
	}
	pkt, ok := m.packetOf(p, f)
	if !ok {
		return d // no address of the peer's family: the table has no rule for it
	}
	d.Enforced = true
	d.Admin, d.Baseline = m.traceTiers(p, f.Dir, pkt)
	d.Isolations = m.traceNetworkPolicy(p, f.Dir, pkt)
	switch {
	case d.Admin.Action == ActionAccept || d.Admin.Action == ActionDeny:
		d.Allowed = d.Admin.Action == ActionAccept
	case d.Isolated():
		d.Allowed = d.NetworkPolicyAllows()
	case d.Baseline.Action != 0:
		d.Allowed = d.Baseline.Action != ActionDeny
	}
	return d
}

// packetOf is f's first packet, from the pod's address of the peer's
// family (to it, for ingress).
func (m *Model) packetOf(p *podState, f Flow) (Packet, bool) {
	i := slices.IndexFunc(p.rec.IPs, func(a netip.Addr) bool { return nodeview.FamilyOf(a) == nodeview.FamilyOf(f.Peer) })
	if i < 0 || !m.family(f.Peer) {
		return Packet{}, false
	}
	pkt := Packet{Src: p.rec.IPs[i], Dst: f.Peer, Proto: f.Proto, Port: f.Port}
	if f.Dir == Ingress {
		pkt.Src, pkt.Dst = f.Peer, p.rec.IPs[i]
	}
	return pkt, true
}

// traceNetworkPolicy: the policies selecting p in direction d, each with
// the first of its rules whose compiled rules match pkt.
func (m *Model) traceNetworkPolicy(p *podState, d Direction, pkt Packet) []Isolation {
	var out []Isolation
	for pol := range p.ns.policies {
		if !pol.has(d) || !pol.rec.PodSelector.Matches(p.labels()) {
			continue
		}
		iso := Isolation{Policy: pol.rec.Key(), Rule: -1}
		for _, it := range pol.items[d] {
			if slices.ContainsFunc(it.appendFor(nil, p.rec), m.t.matches(pkt)) {
				iso.Rule = it.of
				break
			}
		}
		out = append(out, iso)
	}
	slices.SortFunc(out, func(a, b Isolation) int {
		return cmp.Or(cmp.Compare(a.Policy.Namespace, b.Policy.Namespace), cmp.Compare(a.Policy.Name, b.Policy.Name))
	})
	return out
}

// traceTiers: the first rule in each tier's policies selecting p, in the
// order their chains are jumped to, whose compiled rules match pkt.
func (m *Model) traceTiers(p *podState, d Direction, pkt Packet) (admin, baseline ClusterVerdict) {
	admin.Tier, baseline.Tier = AdminTier, BaselineTier
	if m.cl == nil {
		return admin, baseline
	}
	out := [2]*ClusterVerdict{&admin, &baseline}
	nl := labelsOf(p.ns)
	for _, st := range m.cl.order {
		v := out[st.rec.Tier]
		if v.Action != 0 || !st.rec.subjectSelects(nl, p.labels()) {
			continue
		}
		if i := slices.IndexFunc(st.items[d], func(it item) bool { return m.t.matches(pkt)(it.rule) }); i >= 0 {
			r := st.rec.Rules[d][st.items[d][i].of]
			*v = ClusterVerdict{Tier: st.rec.Tier, Policy: st.rec.Name, Rule: r.Index, RuleName: r.Name, Action: r.Action}
		}
	}
	return admin, baseline
}

// matches is Table.match's answer for pkt, as a predicate on rules.
func (t *Table) matches(pkt Packet) func(Rule) bool {
	return func(r Rule) bool {
		_, ok := t.match(r, pkt)
		return ok
	}
}
