package policy

import (
	"slices"
	"strings"
)

// This file puts ClusterNetworkPolicy's two tiers around the NetworkPolicy
// verdict. A local pod's packets in one direction enter, through the
// verdict map, the first of three chains that exist for it:
//
//	admin-<dir>-<hash>     the Admin rules of the policies whose subject
//	                       holds the pod, by priority then rule order:
//	                       Accept returns (judged, allowed), Deny goes to
//	                       the policy's deny chain, Pass goes to the next
//	                       chain, and so does falling off the end
//	<dir>-<hash>           the NetworkPolicy group chain, when a
//	                       NetworkPolicy isolates the pod: its final word
//	baseline-<dir>-<hash>  the Baseline rules likewise, when no
//	                       NetworkPolicy isolates it: Accept and Pass
//	                       return, Deny goes to the deny chain, the end
//	                       returns (the default: allowed)
//
// Every chain is named by a hash of its rules and shared by the pods that
// have the same ones, like group chains, and never changed: a pod whose
// rules change moves to other chains. Peers are the sets NetworkPolicy
// peers use (sel-…, nport-…, cidr-…) and, for nodes, node-…, so a pod or
// Node change touches elements only. A pod no ClusterNetworkPolicy selects
// has the chains NetworkPolicy alone gives it.

// clusterState is the model's ClusterNetworkPolicy part.
type clusterState struct {
	policies map[string]*cnpState
	order    []*cnpState // by clusterOrder, both tiers
	nodes    map[string]*Node
	nodeSels map[string]*nodeSel // by NodeSelector.Key
}

// cnpState is a ClusterNetworkPolicy in the model with what it holds.
type cnpState struct {
	rec   *ClusterPolicy
	items [2][]item // a named port's item has protocol 0: any
	holds
	nodes []*nodeSel
	deny  [2]*group // its deny chains, when a rule denies
}

// passChain stands for the chain after the Admin tier in an Admin item's
// verdict until a pod's chain is made.
const passChain = "\x00pass"

// UpsertClusterPolicy adds or changes a ClusterNetworkPolicy.
func (m *Model) UpsertClusterPolicy(rec *ClusterPolicy) {
	cl := m.cluster()
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
}

func (m *Model) cluster() *clusterState {
	if m.cl == nil {
		m.cl = &clusterState{policies: map[string]*cnpState{}, nodes: map[string]*Node{}, nodeSels: map[string]*nodeSel{}}
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
		for _, r := range rec.Rules[d] {
			st.items[d] = m.appendClusterItems(st, st.items[d], d, r)
		}
	}
	return st
}

// appendClusterItems appends the items of one rule: each peer with each
// port and family, all with the rule's verdict.
func (m *Model) appendClusterItems(st *cnpState, items []item, d Direction, r ClusterRule) []item {
	var v Verdict
	switch r.Action {
	case ActionAccept:
		v = Verdict{Kind: Return}
	case ActionDeny:
		v = Verdict{Kind: Goto, Chain: m.clusterDeny(st, d).chain.Name}
	case ActionPass:
		v = Verdict{Kind: Goto, Chain: passChain}
		if st.rec.Tier == BaselineTier {
			v = Verdict{Kind: Return} // the tier after Baseline is the default: allowed
		}
	}
	if len(r.Peers) == 0 { // failed closed: every connection
		return append(items, item{rule: Rule{Verdict: v}})
	}
	for _, peer := range r.Peers {
		items = portItems(items, m.clusterPeerRules(st, d, peer, v), d, r.Ports, func(items []item, port Port) []item {
			if peer.Pods == nil {
				return items // networks and nodes have no named ports: nothing matches
			}
			return m.appendClusterNamedEgress(st, items, peer.Pods, port.Name, v)
		})
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

// namedProtocols are the protocols a destinationNamedPort may be of: it
// names a container port, whatever its protocol.
var namedProtocols = []uint8{6, 17, 132}

// appendClusterNamedEgress: a named port of the peer's pods is a lookup
// of address . protocol . port in the selector's named set, one rule per
// protocol (nft reads a transport port only after a protocol match).
func (m *Model) appendClusterNamedEgress(st *cnpState, items []item, ps *PeerSelector, name string, v Verdict) []item {
	s := m.acquireSel(ps)
	n := m.acquireNamed(s, name)
	m.releaseSel(s) // the named set holds it
	st.named = append(st.named, n)
	for _, f := range m.fams {
		for _, proto := range namedProtocols {
			items = append(items, item{rule: Rule{Family: f, Proto: proto, PortSet: setName("nport", f, n.hash), Verdict: v}})
		}
	}
	return items
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
// direction (nil where no rule applies); np is its NetworkPolicy group
// chain, nil when no NetworkPolicy isolates it.
func (m *Model) tierChains(p *podState, d Direction, np *group) (out [2]*group) {
	if m.cl == nil || len(m.cl.order) == 0 {
		return out
	}
	var rules [2][]Rule
	nl := labelsOf(p.ns)
	for _, st := range m.cl.order {
		if len(st.items[d]) == 0 || !st.rec.subjectSelects(nl, p.labels()) {
			continue
		}
		t := st.rec.Tier
		for _, it := range st.items[d] {
			if it.name == "" {
				rules[t] = append(rules[t], it.rule)
				continue
			}
			for _, port := range p.rec.Ports {
				if port.Name == it.name && (it.proto == 0 || it.proto == port.Protocol) {
					r := it.rule
					r.Proto, r.PortFrom, r.PortTo = port.Protocol, port.Port, port.Port
					rules[t] = append(rules[t], r)
				}
			}
		}
	}
	next := Verdict{Kind: Return}
	if len(rules[BaselineTier]) > 0 && np == nil {
		out[BaselineTier] = m.acquireChain("baseline-"+d.String()+"-"+hashOf(rulesText(rules[BaselineTier])), rules[BaselineTier])
		next = Verdict{Kind: Goto, Chain: out[BaselineTier].chain.Name}
	}
	if np != nil {
		next = Verdict{Kind: Goto, Chain: np.chain.Name}
	}
	if admin := rules[AdminTier]; len(admin) > 0 {
		for i := range admin {
			if admin[i].Verdict.Chain == passChain {
				admin[i].Verdict = next
			}
		}
		if next.Kind == Goto {
			admin = append(admin, Rule{Verdict: next})
		}
		out[AdminTier] = m.acquireChain("admin-"+d.String()+"-"+hashOf(rulesText(admin)), admin)
	}
	return out
}

func rulesText(rules []Rule) string {
	texts := make([]string, len(rules))
	for i, r := range rules {
		texts[i] = r.Text()
	}
	return strings.Join(texts, "\n")
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

// ClusterPolicies are the ClusterNetworkPolicies in the model, in the
// order they are judged within their tier.
func (m *Model) ClusterPolicies() []*ClusterPolicy {
	if m.cl == nil {
		return nil
	}
	out := make([]*ClusterPolicy, len(m.cl.order))
	for i, st := range m.cl.order {
		out[i] = st.rec
	}
	return out
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
