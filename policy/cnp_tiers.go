package policy

import (
	"net/netip"

	"github.com/netplane/netplane/nodeview"
)

// This file holds the parts of the tiers every policy shares (cnp_model.go
// says how they fit): the chains a rule leaves its policy's chain for, and
// the next maps. They exist while any ClusterNetworkPolicy does.

// acceptEgress is where an egress Accept goes: the destination's ingress
// is judged, then the packet accepted.
const acceptEgress = "accept-egress"

// passChain is where an Admin Pass goes in direction d: the pod's chain
// after the Admin tier, for egress the destination's ingress, then accept.
func passChain(d Direction) string { return "pass-" + d.String() }

// nextMap maps a pod with an Admin chain to its next chain.
func nextMap(d Direction, f nodeview.Family) string { return d.String() + "-next" + suffix(f) }

// tierBase makes (on) or removes the shared chains and maps.
func (m *Model) tierBase(on bool) {
	if !on {
		for _, name := range []string{acceptEgress, passChain(Egress), passChain(Ingress)} {
			m.dropChain(name)
		}
		for _, d := range directions {
			for _, f := range m.fams {
				m.dropSet(nextMap(d, f))
			}
			m.cl.next[d] = map[netip.Addr]string{}
		}
		return
	}
	for _, d := range directions {
		for _, f := range m.fams {
			m.putSet(newSet(nextMap(d, f), f, AddrVerdictMap))
		}
	}
	var ingress, egressNext []Rule
	for _, f := range m.fams {
		ingress = append(ingress, Rule{Family: f, Field: Daddr, Vmap: mapName(Ingress, f)})
		egressNext = append(egressNext, Rule{Family: f, Field: Saddr, Vmap: nextMap(Egress, f)})
	}
	accept := Rule{Verdict: Verdict{Kind: Accept}}
	m.putChain(&Chain{Name: acceptEgress, Rules: append(append([]Rule{}, ingress...), accept)})
	m.putChain(&Chain{Name: passChain(Egress), Rules: append(append(egressNext, ingress...), accept)})
	var ingressNext []Rule
	for _, f := range m.fams {
		ingressNext = append(ingressNext, Rule{Family: f, Field: Daddr, Vmap: nextMap(Ingress, f)})
	}
	m.putChain(&Chain{Name: passChain(Ingress), Rules: append(ingressNext, accept)})
}

// syncNext sets the next map elements of an address to the next chains
// of its first claimant.
func (m *Model) syncNext(a netip.Addr) {
	if m.cl == nil || len(m.cl.policies) == 0 {
		return
	}
	for _, d := range directions {
		want := ""
		if c := m.claims[a]; len(c) > 0 {
			want = c[0].enf.next[d]
		}
		have := m.cl.next[d][a]
		if want == have {
			continue
		}
		set := nextMap(d, nodeview.FamilyOf(a))
		if have != "" {
			m.delElem(set, Element{Addr: a, Chain: have})
			delete(m.cl.next[d], a)
		}
		if want != "" {
			m.addElem(set, Element{Addr: a, Chain: want})
			m.cl.next[d][a] = want
		}
	}
}
