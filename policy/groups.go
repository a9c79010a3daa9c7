package policy

import (
	"net/netip"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	"github.com/netplane/netplane/nodeview"
)

// This file turns policies into the chains a local pod's traffic goes
// through. Each policy becomes a list of items, one rule per allowed
// (peer, port) and family; a local pod's rules in a direction are the
// items of the policies selecting it, named ingress ports resolved on the
// pod, sorted and deduplicated. Pods with the same rules share one group
// chain, named by a hash of its rules, which the verdict maps send the
// pod's packets to. A group chain never changes: a pod whose rules change
// moves to another.

// policyState is a policy in the model with the sets it holds.
type policyState struct {
	rec   *Policy
	ns    *nsState
	items [2][]item
	holds
}

// holds are the shared sets a policy holds, released with it.
type holds struct {
	sels   []*selector
	named  []*namedSet
	blocks []*block
}

// item is a rule of a group chain, or with name set, a rule waiting for
// the destination pod's port of that name and protocol; of is the place
// of the API rule it comes from in its policy's list (what a trace names).
type item struct {
	rule  Rule
	name  string
	proto uint8
	of    int
}

// appendFor appends the item's rules for the local pod p: itself, or one
// per port of p of its name and protocol.
func (it item) appendFor(rules []Rule, p *Pod) []Rule {
	if it.name == "" {
		return append(rules, it.rule)
	}
	for _, port := range p.Ports {
		if port.Name == it.name && port.Protocol == it.proto {
			r := it.rule
			r.Proto, r.PortFrom, r.PortTo = port.Protocol, port.Port, port.Port
			rules = append(rules, r)
		}
	}
	return rules
}

// numbered sets the place of the API rule of items[from:], made from it.
func numbered(items []item, from, of int) []item {
	for i := range items[from:] {
		items[from+i].of = of
	}
	return items
}

func (pol *policyState) has(d Direction) bool {
	if d == Egress {
		return pol.rec.Egress
	}
	return pol.rec.Ingress
}

// group is a group chain and the number of pod directions using it.
type group struct {
	chain *Chain
	refs  int
}

// UpsertPolicy adds or changes a policy.
func (m *Model) UpsertPolicy(rec *Policy) {
	st := m.namespace(rec.Namespace)
	old := m.policies[rec.Key()]
	pol := m.newPolicy(rec, st)
	m.policies[rec.Key()] = pol
	if old != nil {
		delete(st.policies, old)
	}
	st.policies[pol] = struct{}{}
	m.regroupFor(st, old, pol)
	if old != nil {
		m.releasePolicy(old) // after the new one took its sets: shared ones stay
	}
}

// DeletePolicy removes a policy.
func (m *Model) DeletePolicy(key types.NamespacedName) {
	old := m.policies[key]
	if old == nil {
		return
	}
	delete(m.policies, key)
	delete(old.ns.policies, old)
	m.regroupFor(old.ns, old, nil)
	m.releasePolicy(old)
	m.forgetNamespace(old.ns)
}

// regroupFor regroups the local pods of st that old or pol selects.
func (m *Model) regroupFor(st *nsState, old, pol *policyState) {
	for p := range st.local {
		if (old != nil && old.rec.PodSelector.Matches(p.labels())) || (pol != nil && pol.rec.PodSelector.Matches(p.labels())) {
			m.regroup(p)
		}
	}
}

func (m *Model) newPolicy(rec *Policy, st *nsState) *policyState {
	pol := &policyState{rec: rec, ns: st}
	for _, d := range directions {
		if !pol.has(d) {
			continue // rules of a type not in policyTypes are ignored, as upstream
		}
		rules := rec.IngressRules
		if d == Egress {
			rules = rec.EgressRules
		}
		for i, r := range rules {
			n := len(pol.items[d])
			pol.items[d] = numbered(m.appendItems(pol, pol.items[d], d, r), n, i)
		}
	}
	return pol
}

// appendItems appends the items of one rule: each peer with each port.
func (m *Model) appendItems(pol *policyState, items []item, d Direction, r PolicyRule) []item {
	peers := r.Peers
	if len(peers) == 0 {
		peers = []Peer{{}} // every peer
	}
	for _, peer := range peers {
		var bases []Rule
		if len(r.Ports) == 0 || slices.ContainsFunc(r.Ports, func(p Port) bool { return p.Name == "" || d == Ingress }) {
			bases = m.peerRules(&pol.holds, d, peer, Verdict{Kind: Return})
		}
		items = portItems(items, bases, d, r.Ports, func(items []item, port Port) []item {
			return m.appendNamedEgress(pol, items, peer, port)
		})
	}
	return items
}

// portItems appends the items of a peer's rules (bases) with each port
// (none: every port): a number or range is matched in the rule, an
// ingress named port waits for the local pod's port, an egress one is
// namedEgress's.
func portItems(items []item, bases []Rule, d Direction, ports []Port, namedEgress func([]item, Port) []item) []item {
	if len(ports) == 0 {
		for _, b := range bases {
			items = append(items, item{rule: b})
		}
		return items
	}
	for _, port := range ports {
		switch {
		case port.Name == "":
			for _, b := range bases {
				b.Proto, b.PortFrom, b.PortTo = port.Protocol, port.Port, port.EndPort
				items = append(items, item{rule: b})
			}
		case d == Ingress:
			for _, b := range bases {
				items = append(items, item{rule: b, name: port.Name, proto: port.Protocol})
			}
		default:
			items = namedEgress(items, port)
		}
	}
	return items
}

// peerRules are the rules matching a peer as the source (ingress) or
// destination (egress), one per family it can have, with verdict ret.
func (m *Model) peerRules(pol *holds, d Direction, peer Peer, ret Verdict) []Rule {
	field := Saddr
	if d == Egress {
		field = Daddr
	}
	switch {
	case peer.Pods != nil:
		s := m.acquireSel(peer.Pods)
		pol.sels = append(pol.sels, s)
		out := make([]Rule, 0, len(m.fams))
		for _, f := range m.fams {
			out = append(out, Rule{Family: f, Field: field, Set: setName("sel", f, s.hash), Verdict: ret})
		}
		return out
	case peer.Block != nil:
		if !slices.Contains(m.fams, peer.Block.Family) {
			return nil
		}
		bl := m.acquireBlock(peer.Block)
		pol.blocks = append(pol.blocks, bl)
		return []Rule{{Family: bl.b.Family, Field: field, Set: bl.name, Verdict: ret}}
	}
	return []Rule{{Verdict: ret}}
}

// appendNamedEgress: a named port on the peer's pods is a lookup of
// address . protocol . port in the named set of the peer's selector (of
// every pod when the rule names no peer). An address block's named port is
// that of the pods inside the block: addresses that are no pod's have no
// named port.
func (m *Model) appendNamedEgress(pol *policyState, items []item, peer Peer, port Port) []item {
	ps, fams := peer.Pods, m.fams
	var bl *block
	switch {
	case peer.Block != nil:
		if !slices.Contains(m.fams, peer.Block.Family) {
			return items
		}
		ps, fams = allPods, []nodeview.Family{peer.Block.Family}
		bl = m.acquireBlock(peer.Block)
		pol.blocks = append(pol.blocks, bl)
	case ps == nil:
		ps = allPods
	}
	s := m.acquireSel(ps)
	n := m.acquireNamed(s, port.Name)
	m.releaseSel(s) // the named set holds it
	pol.named = append(pol.named, n)
	for _, f := range fams {
		r := Rule{Family: f, Proto: port.Protocol, PortSet: setName("nport", f, n.hash), Verdict: Verdict{Kind: Return}}
		if bl != nil {
			r.Field, r.Set = Daddr, bl.name
		}
		items = append(items, item{rule: r})
	}
	return items
}

func (m *Model) releasePolicy(pol *policyState) { m.release(&pol.holds) }

func (m *Model) release(pol *holds) {
	for _, n := range pol.named {
		m.releaseNamed(n)
	}
	for _, s := range pol.sels {
		m.releaseSel(s)
	}
	for _, bl := range pol.blocks {
		m.releaseBlock(bl)
	}
}

// regroup moves a pod to the group chains its policies make now, and its
// verdict map elements with it.
func (m *Model) regroup(p *podState) {
	e := p.enf
	if e == nil {
		return // not enforced here: holds no chains
	}
	_, local := p.ns.local[p]
	changed := false
	for _, d := range directions {
		var g *group
		var tg [2]*group
		if local {
			if rules, isolated := m.rulesOf(p, d); isolated {
				g = m.acquireGroup(d, rules)
			}
			tg = m.tierChains(p, d, g)
		}
		old, oldTiers := e.groups[d], e.tiers[d]
		e.groups[d], e.tiers[d] = g, tg
		// Released after the new ones are taken: shared chains stay.
		for _, o := range [...]*group{old, oldTiers[AdminTier], oldTiers[BaselineTier]} {
			if o != nil {
				m.releaseGroup(o)
			}
		}
		entry, next := entryOf(g, tg), nextOf(g, tg)
		changed = changed || entry != e.entry[d] || next != e.next[d]
		e.entry[d], e.next[d] = entry, next
	}
	if changed {
		for _, a := range p.rec.IPs {
			m.syncAddr(a)
		}
	}
}

// rulesOf collects the rules of the policies selecting p in direction d;
// isolated is false when none does.
func (m *Model) rulesOf(p *podState, d Direction) (rules []Rule, isolated bool) {
	for pol := range p.ns.policies {
		if !pol.has(d) || !pol.rec.PodSelector.Matches(p.labels()) {
			continue
		}
		isolated = true
		for _, it := range pol.items[d] {
			rules = it.appendFor(rules, p.rec)
		}
	}
	return rules, isolated
}

// acquireGroup returns the group chain of these rules, made on first use.
func (m *Model) acquireGroup(d Direction, rules []Rule) *group {
	type keyed struct {
		text string
		rule Rule
	}
	ks := make([]keyed, 0, len(rules))
	for _, r := range rules {
		if r == (Rule{Verdict: Verdict{Kind: Return}}) {
			ks = []keyed{{r.Text(), r}} // allows everything: nothing else matters
			break
		}
		ks = append(ks, keyed{r.Text(), r})
	}
	slices.SortFunc(ks, func(a, b keyed) int { return strings.Compare(a.text, b.text) })
	ks = slices.CompactFunc(ks, func(a, b keyed) bool { return a.text == b.text })
	texts := make([]string, len(ks))
	for i, k := range ks {
		texts[i] = k.text
	}
	name := d.String() + "-" + hashOf(strings.Join(texts, "\n"))
	if g := m.groups[name]; g != nil {
		g.refs++
		return g
	}
	c := &Chain{Name: name, Rules: make([]Rule, 0, len(ks)+1)}
	for _, k := range ks {
		c.Rules = append(c.Rules, k.rule)
	}
	c.Rules = append(c.Rules, Rule{Verdict: Verdict{Kind: Goto, Chain: denyChain(d)}})
	g := &group{chain: c, refs: 1}
	m.groups[name] = g
	m.putChain(c)
	return g
}

func (m *Model) releaseGroup(g *group) {
	if g.refs--; g.refs > 0 {
		return
	}
	delete(m.groups, g.chain.Name)
	m.dropChain(g.chain.Name)
}

// claim records p as a holder of its addresses of the model's families.
func (m *Model) claim(p *podState, ips []netip.Addr) []netip.Addr {
	for _, a := range ips {
		if m.family(a) {
			m.claims[a] = append(m.claims[a], p)
		}
	}
	return ips
}

func (m *Model) unclaim(p *podState, ips []netip.Addr) []netip.Addr {
	for _, a := range ips {
		c := slices.DeleteFunc(m.claims[a], func(q *podState) bool { return q == p })
		if len(c) == 0 {
			delete(m.claims, a)
		} else {
			m.claims[a] = c
		}
	}
	return ips
}

// syncAddr sets the verdict map elements of an address to the group
// chains of its first claimant.
func (m *Model) syncAddr(a netip.Addr) {
	if !m.family(a) {
		return
	}
	for _, d := range directions {
		want := ""
		if c := m.claims[a]; len(c) > 0 {
			want = c[0].enf.entry[d]
		}
		have := m.vmap[d][a]
		if want == have {
			continue
		}
		set := mapName(d, nodeview.FamilyOf(a))
		if have != "" {
			m.delElem(set, Element{Addr: a, Chain: have})
			delete(m.vmap[d], a)
		}
		if want != "" {
			m.addElem(set, Element{Addr: a, Chain: want})
			m.vmap[d][a] = want
		}
	}
	m.syncNext(a)
}

func mapName(d Direction, f nodeview.Family) string { return d.String() + "-pods" + suffix(f) }

func denyChain(d Direction) string { return "deny-" + d.String() }

// CounterName is the named counter of packets denied in direction d.
func CounterName(d Direction) string { return "denied-" + d.String() }

// baseChains declares what exists whatever the objects: the base chains
// on forward and input, the deny chains, the verdict maps, the counters.
func (m *Model) baseChains() {
	first := []Rule{{Established: true, Verdict: Verdict{Kind: Accept}}}
	if slices.Contains(m.fams, nodeview.IPv6) {
		// Without neighbour discovery no IPv6 packet reaches a pod, allowed or not.
		first = append(first, Rule{NeighborDiscovery: true, Verdict: Verdict{Kind: Accept}})
	}
	fwd := &Chain{Name: "forward", Base: &Hook{Hook: "forward", Priority: m.cfg.Priority}, Rules: slices.Clone(first)}
	in := &Chain{Name: "input", Base: &Hook{Hook: "input", Priority: m.cfg.Priority}, Rules: slices.Clone(first)}
	for _, f := range m.fams {
		egress := Rule{Family: f, Field: Saddr, Vmap: mapName(Egress, f)}
		fwd.Rules = append(fwd.Rules, egress)
		in.Rules = append(in.Rules, egress)
	}
	for _, f := range m.fams {
		fwd.Rules = append(fwd.Rules, Rule{Family: f, Field: Daddr, Vmap: mapName(Ingress, f)})
	}
	m.putChain(fwd)
	m.putChain(in)
	for _, d := range directions {
		deny := &Chain{Name: denyChain(d)}
		if l := m.cfg.Log; l.Rate != 0 {
			l.Prefix += d.String() + " "
			deny.Rules = append(deny.Rules, Rule{Log: l})
		}
		deny.Rules = append(deny.Rules, Rule{Counter: CounterName(d), Verdict: Verdict{Kind: Drop}})
		m.putChain(deny)
		m.t.Counters = append(m.t.Counters, CounterName(d))
		for _, f := range m.fams {
			m.putSet(newSet(mapName(d, f), f, AddrVerdictMap))
		}
	}
}
