package policy

import (
	"cmp"
	"net/netip"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// This file holds the reference for ClusterNetworkPolicy: a straight
// reading of the v0.3.0 API's documentation on API objects, with no sets,
// chains or compiled form, over the NetworkPolicy reference of
// oracle_test.go, and a cluster that feeds both kinds of policy and the
// Nodes to one Model per node.

// tiered is a cluster with ClusterNetworkPolicies and Nodes.
type tiered struct {
	*cluster
	cnps  map[string]*cnpv1.ClusterNetworkPolicy
	nodes map[string]*v1.Node
}

func newTiered(nodes []string) *tiered {
	return &tiered{cluster: newCluster(nodes, nil), cnps: map[string]*cnpv1.ClusterNetworkPolicy{}, nodes: map[string]*v1.Node{}}
}

func (c *tiered) setCNP(t testing.TB, cnp *cnpv1.ClusterNetworkPolicy) {
	t.Helper()
	p, err := CompileCluster(cnp)
	if err != nil {
		t.Fatalf("compile %s: %v", cnp.Name, err)
	}
	c.cnps[cnp.Name] = cnp
	for _, m := range c.models {
		m.UpsertClusterPolicy(p)
	}
}

func (c *tiered) deleteCNP(name string) {
	delete(c.cnps, name)
	for _, m := range c.models {
		m.DeleteClusterPolicy(name)
	}
}

func (c *tiered) setNode(n *v1.Node) {
	c.nodes[n.Name] = n
	for _, m := range c.models {
		m.UpsertNode(NodeFromAPI(n))
	}
}

// fresh builds each node's model anew from the objects.
func (c *tiered) fresh(t testing.TB) map[string]*Model {
	out := c.cluster.fresh(t)
	for _, m := range out {
		for _, n := range c.nodes {
			m.UpsertNode(NodeFromAPI(n))
		}
		for _, cnp := range c.cnps {
			p, err := CompileCluster(cnp)
			if err != nil {
				t.Fatal(err)
			}
			m.UpsertClusterPolicy(p)
		}
	}
	return out
}

// allowedTiered is the API's answer with both tiers: the source's egress
// and the destination's ingress must each allow.
func (c *tiered) allowedTiered(from, to endpoint, port int32, proto v1.Protocol) bool {
	return c.tieredAllows(netv1.PolicyTypeEgress, from, to, to, port, proto) &&
		c.tieredAllows(netv1.PolicyTypeIngress, to, from, to, port, proto)
}

// tieredAllows: Admin decides unless it passes or nothing matches; then a
// NetworkPolicy isolating self decides; then Baseline; then allowed.
func (c *tiered) tieredAllows(dir netv1.PolicyType, self, peer, dst endpoint, port int32, proto v1.Protocol) bool {
	if self.pod == nil || self.pod.Spec.HostNetwork || terminal(self.pod) {
		return true
	}
	switch a, _, _ := c.tierDecides(cnpv1.AdminTier, dir, self, peer, dst, port, proto); a {
	case cnpv1.ClusterNetworkPolicyRuleActionAccept:
		return true
	case cnpv1.ClusterNetworkPolicyRuleActionDeny:
		return false
	}
	for _, np := range c.policies {
		if np.Namespace == self.pod.Namespace && hasType(np, dir) && selects(&np.Spec.PodSelector, self.pod.Labels) {
			return c.directionAllows(dir, self, peer, dst, port, proto)
		}
	}
	a, _, _ := c.tierDecides(cnpv1.BaselineTier, dir, self, peer, dst, port, proto)
	return a != cnpv1.ClusterNetworkPolicyRuleActionDeny
}

// tierDecides is the first rule of the tier that matches, by priority
// (then name) and rule order: its action, policy and index ("" when none).
func (c *tiered) tierDecides(tier cnpv1.Tier, dir netv1.PolicyType, self, peer, dst endpoint, port int32, proto v1.Protocol) (cnpv1.ClusterNetworkPolicyRuleAction, string, int) {
	var pols []*cnpv1.ClusterNetworkPolicy
	for _, p := range c.cnps {
		if p.Spec.Tier == tier {
			pols = append(pols, p)
		}
	}
	slices.SortFunc(pols, func(a, b *cnpv1.ClusterNetworkPolicy) int {
		return cmp.Or(cmp.Compare(a.Spec.Priority, b.Spec.Priority), strings.Compare(a.Name, b.Name))
	})
	for _, p := range pols {
		if !c.subjectHolds(p.Spec.Subject, self.pod) {
			continue
		}
		if dir == netv1.PolicyTypeIngress {
			for i, r := range p.Spec.Ingress {
				peers := make([]cnpv1.ClusterNetworkPolicyEgressPeer, len(r.From))
				for j, f := range r.From {
					peers[j] = cnpv1.ClusterNetworkPolicyEgressPeer{Namespaces: f.Namespaces, Pods: f.Pods}
				}
				if a, ok := c.ruleDecides(r.Action, peers, r.Protocols, peer, dst, port, proto); ok {
					return a, p.Name, i
				}
			}
			continue
		}
		for i, r := range p.Spec.Egress {
			if a, ok := c.ruleDecides(r.Action, r.To, r.Protocols, peer, dst, port, proto); ok {
				return a, p.Name, i
			}
		}
	}
	return "", "", 0
}

func (c *tiered) subjectHolds(s cnpv1.ClusterNetworkPolicySubject, p *v1.Pod) bool {
	nsl := c.nsLabels(p.Namespace)
	if s.Namespaces != nil {
		return selects(s.Namespaces, nsl)
	}
	return selects(&s.Pods.NamespaceSelector, nsl) && selects(&s.Pods.PodSelector, p.Labels)
}

// ruleDecides: whether the rule matches, and the action it then takes. A
// peer or protocol with no field set fails the rule closed: an Accept
// matches nothing, a Deny or Pass denies everything.
func (c *tiered) ruleDecides(action cnpv1.ClusterNetworkPolicyRuleAction, peers []cnpv1.ClusterNetworkPolicyEgressPeer,
	protos []cnpv1.ClusterNetworkPolicyProtocol, peer, dst endpoint, port int32, proto v1.Protocol) (cnpv1.ClusterNetworkPolicyRuleAction, bool) {
	unknown := slices.ContainsFunc(peers, func(p cnpv1.ClusterNetworkPolicyEgressPeer) bool {
		return p.Namespaces == nil && p.Pods == nil && p.Nodes == nil && len(p.Networks) == 0
	}) || slices.ContainsFunc(protos, func(p cnpv1.ClusterNetworkPolicyProtocol) bool {
		return p.TCP == nil && p.UDP == nil && p.SCTP == nil && p.DestinationNamedPort == ""
	})
	if unknown {
		if action == cnpv1.ClusterNetworkPolicyRuleActionAccept {
			return "", false
		}
		return cnpv1.ClusterNetworkPolicyRuleActionDeny, true
	}
	for _, p := range peers {
		if c.cnpPeerMatches(p, peer) && cnpProtocolsMatch(protos, p, dst, port, proto) {
			return action, true
		}
	}
	return "", false
}

func (c *tiered) cnpPeerMatches(p cnpv1.ClusterNetworkPolicyEgressPeer, e endpoint) bool {
	active := e.pod != nil && !e.pod.Spec.HostNetwork && !terminal(e.pod)
	switch {
	case p.Namespaces != nil:
		return active && selects(p.Namespaces, c.nsLabels(e.pod.Namespace))
	case p.Pods != nil:
		return active && selects(&p.Pods.NamespaceSelector, c.nsLabels(e.pod.Namespace)) && selects(&p.Pods.PodSelector, e.pod.Labels)
	case p.Nodes != nil:
		for _, n := range c.nodes {
			if selects(p.Nodes, n.Labels) && slices.ContainsFunc(n.Status.Addresses, func(a v1.NodeAddress) bool { return a.Address == e.ip.String() }) {
				return true
			}
		}
		return false
	}
	for _, n := range p.Networks {
		if netip.MustParsePrefix(string(n)).Contains(e.ip) {
			return true
		}
	}
	return false
}

// cnpProtocolsMatch: none given matches all; a named port is the
// destination pod's, and networks and nodes have none.
func cnpProtocolsMatch(protos []cnpv1.ClusterNetworkPolicyProtocol, peer cnpv1.ClusterNetworkPolicyEgressPeer, dst endpoint, port int32, proto v1.Protocol) bool {
	if len(protos) == 0 {
		return true
	}
	for _, p := range protos {
		var dp *cnpv1.Port
		switch {
		case p.TCP != nil && proto == v1.ProtocolTCP:
			dp = p.TCP.DestinationPort
		case p.UDP != nil && proto == v1.ProtocolUDP:
			dp = p.UDP.DestinationPort
		case p.SCTP != nil && proto == v1.ProtocolSCTP:
			dp = p.SCTP.DestinationPort
		case p.DestinationNamedPort != "":
			if dst.pod != nil && peer.Networks == nil && peer.Nodes == nil && podServes(dst.pod, p.DestinationNamedPort, port, proto) {
				return true
			}
		}
		if dp != nil && (dp.Number == port || (dp.Range != nil && dp.Range.Start <= port && port <= dp.Range.End)) {
			return true
		}
	}
	return false
}

// checkTieredTruthTable compares the models' verdicts, their tables' and
// their traces', with the API's on every probe, and the Admin and Baseline
// rules Model.Trace names with
// the API's first matching rules.
func (c *tiered) checkTieredTruthTable(t *testing.T, models map[string]*Model, outside []netip.Addr) {
	t.Helper()
	bad := 0
	for _, pr := range c.probes(outside) {
		proto, _ := protocolNumber(pr.proto)
		want := c.allowedTiered(pr.from, pr.to, pr.port, pr.proto)
		got, steps := c.judge(models, pr.from, pr.to, uint16(pr.port), proto)
		if got != want {
			if bad++; bad <= 5 {
				t.Errorf("%s: API says allowed=%v, tables say %v; trace:\n  %s", pr, want, got, strings.Join(steps, "\n  "))
			}
		}
		if traced := traceAllows(models, pr.from, pr.to, uint16(pr.port), proto); traced != want {
			if bad++; bad <= 5 {
				t.Errorf("%s: API says allowed=%v, the traces say %v", pr, want, traced)
			}
		}
		for _, d := range directions {
			self, peer := pr.to, pr.from
			if d == Egress {
				self, peer = pr.from, pr.to
			}
			if self.pod == nil || models[self.pod.Spec.NodeName] == nil {
				continue
			}
			dir := netv1.PolicyTypeIngress
			if d == Egress {
				dir = netv1.PolicyTypeEgress
			}
			m := models[self.pod.Spec.NodeName]
			f := Flow{Dir: d, Pod: podKey(self.pod.Namespace, self.pod.Name), Peer: peer.ip, Proto: proto, Port: uint16(pr.port)}
			dec := m.Trace(f)
			gotT := [2]ClusterVerdict{dec.Admin, dec.Baseline}
			for i, tier := range []cnpv1.Tier{cnpv1.AdminTier, cnpv1.BaselineTier} {
				var a cnpv1.ClusterNetworkPolicyRuleAction
				var name string
				var idx int
				if !self.pod.Spec.HostNetwork && !terminal(self.pod) { // else neither selected nor judged
					a, name, idx = c.tierDecides(tier, dir, self, peer, pr.to, pr.port, pr.proto)
				}
				g := gotT[i]
				if string(a) != g.Action.String() || (a != "" && (g.Policy != name || g.Rule != idx)) {
					if bad++; bad <= 5 {
						t.Errorf("%s %s: API says %s %s rule %d %q, Trace says %v", pr, d, tier, name, idx, a, g)
					}
				}
			}
		}
	}
	if bad > 5 {
		t.Errorf("... %d mismatches in all", bad)
	}
}

// cnpObject is a ClusterNetworkPolicy of the API.
func cnpObject(name string, tier cnpv1.Tier, prio int32, subject cnpv1.ClusterNetworkPolicySubject) *cnpv1.ClusterNetworkPolicy {
	return &cnpv1.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: cnpv1.ClusterNetworkPolicySpec{Tier: tier, Priority: prio, Subject: subject}}
}

// nsLabels are a namespace's labels; none for one deleted or not yet seen.
func (c *tiered) nsLabels(name string) map[string]string {
	if ns := c.namespaces[name]; ns != nil {
		return ns.Labels
	}
	return nil
}
