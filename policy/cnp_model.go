package policy

import (
	"net/netip"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/labels"
)

// This file puts ClusterNetworkPolicy's two tiers around the NetworkPolicy
// verdict, in chains shared by every pod the same policies select:
//
//	admin-<dir>-<hash>     a local pod's Admin tier: the rules of each Admin
//	                       policy whose subject holds it, by priority, then
//	                       a lookup of the pod in <dir>-next
//	baseline-<dir>-<hash>  likewise for Baseline, without the lookup
//
// The verdict map element of a pod jumps to the first of its Admin chain,
// its NetworkPolicy group chain (when a NetworkPolicy isolates it) and its
// Baseline chain; <dir>-next maps a pod that has an Admin chain to the
// second of them. A rule decides by leaving the tier's chain: Deny goes
// to the policy's deny chain; an ingress Accept accepts (ingress is the
// table's last word on a packet); an egress Accept goes to accept-egress,
// which judges the destination's ingress, then accepts; an Admin Pass goes
// to pass-<dir>, which runs the pod's next chain (and for egress the
// destination's ingress), then accepts; a Baseline Pass is an Accept (the
// default allows). A packet no rule matches runs off the chain's end.
//
// The rules are in the tier's chain itself, not in a chain per policy
// jumped to in turn: every rule decides, so a rule matching what an
// earlier rule of the tier matches can never decide and is left out, and
// a packet evaluates each distinct match once. Policies an administrator
// writes repeat their rules (the system namespace let through, the
// metadata address denied): on the AMD EPYC machine of docs/benchmarks.md,
// whose kernel calls through retpolines and returns through SRSO's safe
// RET, a SYN through 20 such policies evaluated 425 rules in 30 chains,
// 24-38 µs in nft_do_chain; as the tiers' rules without their repeats, 45
// rules, 4-6 µs.
//
// Every chain is named by a hash of its rules and never changed; peers are
// the sets NetworkPolicy peers use (sel-…, nport-…, interval sets) and
// node-… for nodes, so a pod, namespace or Node change touches elements,
// and a tier chain only when it moves the pod to policies no other pod
// has. A pod no ClusterNetworkPolicy selects has the chains NetworkPolicy
// alone gives it, and a table without any policy has none of these.

// clusterState is the model's ClusterNetworkPolicy part.
type clusterState struct {
	policies map[string]*cnpState
	order    []*cnpState // by clusterOrder, both tiers
	nodes    map[string]*Node
	nodeSels map[string]*nodeSel      // by NodeSelector.Key
	next     [2]map[netip.Addr]string // the next maps' elements: address → chain
}

// cnpState is a ClusterNetworkPolicy in the model with what it holds.
type cnpState struct {
	rec *ClusterPolicy
	holds
	nodes   []*nodeSel
	subject *PeerSelector // its subject's pods, for ingress named ports
	deny    [2]*group     // its deny chains, when a rule denies
	items   [2][]item     // its rules by direction, each with its API rule
	texts   [2][]string   // each item's rule as nft reads it
	matches [2][]string   // the same without the verdict: what it matches
}

// UpsertClusterPolicy adds or changes a ClusterNetworkPolicy.
func (m *Model) UpsertClusterPolicy(rec *ClusterPolicy) {
	cl := m.cluster()
	if len(cl.policies) == 0 {
		m.tierBase(true)
	}
	old := cl.policies[rec.Name]
	st := m.newCluster(rec)
	cl.policies[rec.Name] = st
	cl.order = slices.DeleteFunc(cl.order, func(c *cnpState) bool { return c == old })
	i, _ := slices.BinarySearchFunc(cl.order, st, func(a, b *cnpState) int { return clusterOrder(a.rec, b.rec) })
	cl.order = slices.Insert(cl.order, i, st)
	m.regroupSubjects(old, st)
	if old != nil {
		m.releaseCluster(old)
	}
}

// DeleteClusterPolicy removes a ClusterNetworkPolicy.
func (m *Model) DeleteClusterPolicy(name string) {
	cl := m.cluster()
	old := cl.policies[name]
	if old == nil {
		return
	}
	delete(cl.policies, name)
	cl.order = slices.DeleteFunc(cl.order, func(c *cnpState) bool { return c == old })
	m.regroupSubjects(old, nil)
	m.releaseCluster(old)
	if len(cl.policies) == 0 {
		m.tierBase(false)
	}
}

func (m *Model) cluster() *clusterState {
	if m.cl == nil {
		m.cl = &clusterState{policies: map[string]*cnpState{}, nodes: map[string]*Node{}, nodeSels: map[string]*nodeSel{},
			next: [2]map[netip.Addr]string{{}, {}}}
	}
	return m.cl
}

// regroupSubjects regroups the local pods old or st selects.
func (m *Model) regroupSubjects(old, st *cnpState) {
	for _, ns := range m.ns {
		nl := labelsOf(ns)
		for p := range ns.local {
			if (old != nil && old.rec.subjectSelects(nl, p.labels())) || (st != nil && st.rec.subjectSelects(nl, p.labels())) {
				m.regroup(p)
			}
		}
	}
}

// relabelSubjects regroups a namespace's local pods when its labels change
// which policies' subjects hold them.
func (m *Model) relabelSubjects(st *nsState) {
	if m.cl == nil || len(m.cl.order) == 0 {
		return
	}
	for p := range st.local {
		m.regroup(p)
	}
}

func (m *Model) newCluster(rec *ClusterPolicy) *cnpState {
	st := &cnpState{rec: rec}
	for _, d := range directions {
		var items []item
		for i, r := range rec.Rules[d] {
			n := len(items)
			items = numbered(m.appendClusterItems(st, items, d, r), n, i)
		}
		st.items[d] = items
		for _, it := range items {
			match := it.rule
			match.Verdict = Verdict{}
			st.texts[d] = append(st.texts[d], it.rule.Text())
			st.matches[d] = append(st.matches[d], match.Text())
		}
	}
	return st
}

// clusterVerdict is what a rule of st's does in direction d when it
// matches (the file's comment says why).
func (m *Model) clusterVerdict(st *cnpState, d Direction, a Action) Verdict {
	switch {
	case a == ActionDeny:
		return Verdict{Kind: Goto, Chain: m.clusterDeny(st, d).chain.Name}
	case a == ActionPass && st.rec.Tier == AdminTier:
		return Verdict{Kind: Goto, Chain: passChain(d)}
	case d == Ingress:
		return Verdict{Kind: Accept}
	}
	return Verdict{Kind: Goto, Chain: acceptEgress}
}

// appendClusterItems appends the items of one rule: each peer with each
// port and family, all with the rule's verdict.
func (m *Model) appendClusterItems(st *cnpState, items []item, d Direction, r ClusterRule) []item {
	v := m.clusterVerdict(st, d, r.Action)
	if len(r.Peers) == 0 { // failed closed: every connection
		return append(items, item{rule: Rule{Verdict: v}})
	}
	var numbered []Port
	var named []string
	for _, p := range r.Ports {
		if p.Name == "" {
			numbered = append(numbered, p)
		} else {
			named = append(named, p.Name)
		}
	}
	for _, peer := range r.Peers {
		bases := m.clusterPeerRules(st, d, peer, v)
		if len(numbered) > 0 || len(named) == 0 {
			items = portItems(items, bases, d, numbered, nil)
		}
		for _, name := range named {
			items = m.appendClusterNamed(st, items, d, peer, bases, name, v)
		}
	}
	return items
}

// clusterPeerRules are the rules matching a peer as the source (ingress)
// or destination (egress), one per family it can have.
func (m *Model) clusterPeerRules(st *cnpState, d Direction, peer ClusterPeer, v Verdict) []Rule {
	if peer.Nodes == nil {
		return m.peerRules(&st.holds, d, Peer{Pods: peer.Pods, Block: peer.Block}, v)
	}
	field := Saddr
	if d == Egress {
		field = Daddr
	}
	n := m.acquireNodeSel(peer.Nodes)
	st.nodes = append(st.nodes, n)
	out := make([]Rule, 0, len(m.fams))
	for _, f := range m.fams {
		out = append(out, Rule{Family: f, Field: field, Set: setName("node", f, n.hash), Verdict: v})
	}
	return out
}

// appendClusterNamed: a destination named port is a lookup of address .
// protocol . port in a named set, whatever the protocol (the container
// port's is in the element, so a packet of a protocol without ports never
// matches): for egress, the set of the peer's pods (networks and nodes
// have no named ports: nothing matches); for ingress, the set of the
// subject's pods, after the peer's match.
func (m *Model) appendClusterNamed(st *cnpState, items []item, d Direction, peer ClusterPeer, bases []Rule, name string, v Verdict) []item {
	if d == Egress {
		if peer.Pods == nil {
			return items
		}
		n := m.holdNamed(st, peer.Pods, name)
		for _, f := range m.fams {
			items = append(items, item{rule: Rule{Family: f, PortSet: setName("nport", f, n.hash), Verdict: v}})
		}
		return items
	}
	if st.subject == nil {
		pods := st.rec.Pods
		if pods == nil {
			pods = labels.Everything()
		}
		st.subject = newPeerSelector("", st.rec.Namespaces, pods)
	}
	n := m.holdNamed(st, st.subject, name)
	for _, b := range bases {
		b.PortSet = setName("nport", b.Family, n.hash)
		items = append(items, item{rule: b})
	}
	return items
}

// holdNamed is the named set of a port name on a selector's pods, held by st.
func (m *Model) holdNamed(st *cnpState, ps *PeerSelector, name string) *namedSet {
	s := m.acquireSel(ps)
	n := m.acquireNamed(s, name)
	m.releaseSel(s) // the named set holds it
	st.named = append(st.named, n)
	return n
}

// clusterDeny is the policy's deny chain of a direction: the log line
// (with --network-policy-log-denied) names the policy and its tier.
func (m *Model) clusterDeny(st *cnpState, d Direction) *group {
	if st.deny[d] != nil {
		return st.deny[d]
	}
	var rules []Rule
	if l := m.cfg.Log; l.Rate != 0 {
		l.Prefix = clusterLogPrefix(l.Prefix, d, st.rec)
		rules = append(rules, Rule{Log: l})
	}
	rules = append(rules, Rule{Counter: CounterName(d), Verdict: Verdict{Kind: Drop}})
	st.deny[d] = m.acquireChain(denyChain(d)+"-"+hashOf(st.rec.Tier.String()+"/"+st.rec.Name), rules)
	return st.deny[d]
}

// maxLogPrefix is the longest NFLOG prefix the kernel keeps, less its NUL.
const maxLogPrefix = 127

// clusterLogPrefix is "<prefix><direction> <Tier>:<name> ", the name cut
// to what the kernel keeps.
func clusterLogPrefix(prefix string, d Direction, p *ClusterPolicy) string {
	head := prefix + d.String() + " " + p.Tier.String() + ":"
	name := p.Name
	if len(head)+len(name)+1 > maxLogPrefix {
		name = name[:maxLogPrefix-len(head)-1]
	}
	return head + name + " "
}

func (m *Model) releaseCluster(st *cnpState) {
	m.release(&st.holds)
	for _, n := range st.nodes {
		m.releaseNodeSel(n)
	}
	for _, g := range st.deny {
		if g != nil {
			m.releaseGroup(g)
		}
	}
}

// tierChains are the Admin and Baseline chains of a local pod in one
// direction (nil where no policy applies); np is its NetworkPolicy group
// chain, nil when no NetworkPolicy isolates it, which leaves Baseline out.
func (m *Model) tierChains(p *podState, d Direction, np *group) (out [2]*group) {
	if m.cl == nil || len(m.cl.order) == 0 {
		return out
	}
	var rules [2][]Rule
	var texts [2][]string
	seen := [2]map[string]bool{{}, {}}
	nl := labelsOf(p.ns)
	for _, st := range m.cl.order {
		t := st.rec.Tier
		if len(st.items[d]) == 0 || !st.rec.subjectSelects(nl, p.labels()) {
			continue
		}
		for i, it := range st.items[d] {
			if match := st.matches[d][i]; !seen[t][match] { // else every packet it matches was decided before it
				seen[t][match] = true
				rules[t] = append(rules[t], it.rule)
				texts[t] = append(texts[t], st.texts[d][i])
			}
		}
	}
	if b := rules[BaselineTier]; len(b) > 0 && np == nil {
		out[BaselineTier] = m.acquireChain("baseline-"+d.String()+"-"+hashOf(strings.Join(texts[BaselineTier], "\n")), b)
	}
	if a := rules[AdminTier]; len(a) > 0 {
		for _, f := range m.fams {
			next := Rule{Family: f, Field: podField(d), Vmap: nextMap(d, f)}
			a = append(a, next)
			texts[AdminTier] = append(texts[AdminTier], next.Text())
		}
		out[AdminTier] = m.acquireChain("admin-"+d.String()+"-"+hashOf(strings.Join(texts[AdminTier], "\n")), a)
	}
	return out
}

// podField is the address of the local pod whose rules a packet meets in
// direction d: the source's for egress, the destination's for ingress.
func podField(d Direction) Field {
	if d == Egress {
		return Saddr
	}
	return Daddr
}

// acquireChain returns the chain of this name, made with these rules on
// first use. The name says its rules.
func (m *Model) acquireChain(name string, rules []Rule) *group {
	if g := m.groups[name]; g != nil {
		g.refs++
		return g
	}
	g := &group{chain: &Chain{Name: name, Rules: rules}, refs: 1}
	m.groups[name] = g
	m.putChain(g.chain)
	return g
}

// entryOf is the chain a pod's verdict map element jumps to: the first of
// its Admin, NetworkPolicy and Baseline chains; "" for none.
func entryOf(np *group, tg [2]*group) string {
	for _, g := range []*group{tg[AdminTier], np, tg[BaselineTier]} {
		if g != nil {
			return g.chain.Name
		}
	}
	return ""
}

// nextOf is the chain a pod's next map element jumps to: after its Admin
// chain, the NetworkPolicy or else the Baseline chain; "" for none.
func nextOf(np *group, tg [2]*group) string {
	if tg[AdminTier] == nil {
		return ""
	}
	for _, g := range []*group{np, tg[BaselineTier]} {
		if g != nil {
			return g.chain.Name
		}
	}
	return ""
}

// denyChains are the chains that drop in direction d: NetworkPolicy's and
// each ClusterNetworkPolicy's, whose counters make the denied packets.
func (m *Model) denyChains(d Direction) []string {
	out := []string{denyChain(d)}
	if m.cl != nil {
		for _, st := range m.cl.order {
			if st.deny[d] != nil {
				out = append(out, st.deny[d].chain.Name)
			}
		}
	}
	return out
}
