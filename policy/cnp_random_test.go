package policy

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// Random ClusterNetworkPolicies over random NetworkPolicies: both tiers,
// few priorities (so ties are drawn), every action, every peer (pods,
// namespaces, nodes, networks, and a peer with no field set, as a newer
// CRD's would read), ports, ranges and named ports.

var nodeLabels = map[string][]string{"zone": {"a", "b"}}

// cnpNetworks are CIDRs holding some pods, some outside addresses, or both.
var cnpNetworks = []cnpv1.CIDR{"10.0.1.0/24", "10.0.0.0/16", "0.0.0.0/0", "192.0.2.0/25", "fd00::/64", "::/0", "2001:db8::/32"}

func (g gen) cnpPeer(egress bool) cnpv1.ClusterNetworkPolicyEgressPeer {
	n := 3
	if egress {
		n = 5
	}
	switch g.r.IntN(n) {
	case 0:
		return cnpv1.ClusterNetworkPolicyEgressPeer{Namespaces: g.selector(nsLabels)}
	case 1:
		if g.chance(0.1) {
			return cnpv1.ClusterNetworkPolicyEgressPeer{} // a field this build does not know
		}
		return cnpv1.ClusterNetworkPolicyEgressPeer{Pods: &cnpv1.NamespacedPod{NamespaceSelector: *g.selector(nsLabels), PodSelector: *g.selector(podLabels)}}
	case 2:
		return cnpv1.ClusterNetworkPolicyEgressPeer{Pods: &cnpv1.NamespacedPod{PodSelector: *g.selector(podLabels)}}
	case 3:
		return cnpv1.ClusterNetworkPolicyEgressPeer{Nodes: g.selector(nodeLabels)}
	}
	nets := []cnpv1.CIDR{cnpNetworks[g.r.IntN(len(cnpNetworks))]}
	if g.chance(0.3) {
		nets = append(nets, cnpNetworks[g.r.IntN(len(cnpNetworks))])
	}
	return cnpv1.ClusterNetworkPolicyEgressPeer{Networks: nets}
}

func (g gen) cnpProtocols(named bool) []cnpv1.ClusterNetworkPolicyProtocol {
	if g.chance(0.4) {
		return nil
	}
	var out []cnpv1.ClusterNetworkPolicyProtocol
	for range 1 + g.r.IntN(2) {
		port := &cnpv1.Port{Number: int32(79 + g.r.IntN(4))}
		if g.chance(0.3) {
			start := int32(79 + g.r.IntN(2))
			port = &cnpv1.Port{Range: &cnpv1.PortRange{Start: start, End: start + 1 + int32(g.r.IntN(2))}}
		}
		switch g.r.IntN(4) {
		case 0:
			out = append(out, cnpv1.ClusterNetworkPolicyProtocol{TCP: &cnpv1.ClusterNetworkPolicyProtocolTCP{DestinationPort: port}})
		case 1:
			out = append(out, cnpv1.ClusterNetworkPolicyProtocol{UDP: &cnpv1.ClusterNetworkPolicyProtocolUDP{DestinationPort: port}})
		case 2:
			out = append(out, cnpv1.ClusterNetworkPolicyProtocol{SCTP: &cnpv1.ClusterNetworkPolicyProtocolSCTP{DestinationPort: port}})
		default:
			if !named {
				continue // the API refuses a named port towards networks or nodes
			}
			out = append(out, cnpv1.ClusterNetworkPolicyProtocol{DestinationNamedPort: g.pick("serve-80-tcp", "serve-81-udp", "web")})
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

var cnpActions = []cnpv1.ClusterNetworkPolicyRuleAction{cnpv1.ClusterNetworkPolicyRuleActionAccept,
	cnpv1.ClusterNetworkPolicyRuleActionDeny, cnpv1.ClusterNetworkPolicyRuleActionPass}

func (g gen) cnp(name string) *cnpv1.ClusterNetworkPolicy {
	tier := cnpv1.AdminTier
	if g.chance(0.5) {
		tier = cnpv1.BaselineTier
	}
	subject := cnpv1.ClusterNetworkPolicySubject{Namespaces: g.selector(nsLabels)}
	if g.chance(0.5) {
		subject = cnpv1.ClusterNetworkPolicySubject{Pods: &cnpv1.NamespacedPod{NamespaceSelector: *g.selector(nsLabels), PodSelector: *g.selector(podLabels)}}
	}
	p := cnpObject(name, tier, int32(g.r.IntN(3)), subject)
	for range g.r.IntN(3) {
		r := cnpv1.ClusterNetworkPolicyIngressRule{Action: cnpActions[g.r.IntN(3)], Name: "in"}
		for range 1 + g.r.IntN(2) {
			peer := g.cnpPeer(false)
			r.From = append(r.From, cnpv1.ClusterNetworkPolicyIngressPeer{Namespaces: peer.Namespaces, Pods: peer.Pods})
		}
		r.Protocols = g.cnpProtocols(true)
		p.Spec.Ingress = append(p.Spec.Ingress, r)
	}
	for range g.r.IntN(3) {
		r := cnpv1.ClusterNetworkPolicyEgressRule{Action: cnpActions[g.r.IntN(3)]}
		named := true
		for range 1 + g.r.IntN(2) {
			peer := g.cnpPeer(true)
			named = named && peer.Networks == nil && peer.Nodes == nil
			r.To = append(r.To, peer)
		}
		r.Protocols = g.cnpProtocols(named)
		p.Spec.Egress = append(p.Spec.Egress, r)
	}
	return p
}

// cnpNodes are the two nodes, their addresses among the outside ones.
func (g gen) cnpNodes() []*v1.Node {
	var out []*v1.Node
	for i, addrs := range [][]string{{"192.0.2.10", "2001:db8::10"}, {"192.0.2.200"}} {
		n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprint("n", i+1), Labels: g.labels(nodeLabels)}}
		for _, a := range addrs {
			n.Status.Addresses = append(n.Status.Addresses, v1.NodeAddress{Type: v1.NodeInternalIP, Address: a})
		}
		out = append(out, n)
	}
	return out
}

func (c *tiered) populate(t testing.TB, g gen) {
	for _, n := range g.cnpNodes() {
		c.setNode(n)
	}
	for _, ns := range modelNamespaces {
		c.setNamespace(g.namespace(ns))
		for _, name := range modelPods {
			c.setPod(g.pod(ns, name))
		}
	}
	for i := range g.r.IntN(3) {
		c.setPolicy(t, g.policy(fmt.Sprint("p", i)))
	}
	for i := range 1 + g.r.IntN(4) {
		c.setCNP(t, g.cnp(fmt.Sprint("c", i)))
	}
}

func TestRandomClusterPoliciesMatchTheAPI(t *testing.T) {
	for seed := range uint64(150) {
		g := gen{rand.New(rand.NewPCG(seed, 3))}
		c := newTiered([]string{"n1", "n2"})
		c.populate(t, g)
		c.checkTieredTruthTable(t, c.models, outside)
		if t.Failed() {
			t.Fatalf("seed %d; policies:\n%s", seed, c.describeCNPs())
		}
	}
}

// TestRandomClusterPolicyChangesKeepTheIncrementalTableRight: after each
// random change (policies of both kinds, pods, namespaces, Nodes) the
// incremental table equals a fresh one, and Touched names every
// difference.
func TestRandomClusterPolicyChangesKeepTheIncrementalTableRight(t *testing.T) {
	for seed := range uint64(40) {
		g := gen{rand.New(rand.NewPCG(seed, 4))}
		c := newTiered([]string{"n1", "n2"}) // n1's table is compared; n2 judges its pods
		c.populate(t, g)
		m := c.models["n1"]
		m.TakeTouched()
		for i := range 60 {
			before := snapshot(m.Table())
			what := g.tieredChange(t, c)
			after := snapshot(m.Table())
			if missed := before.untouched(after, m.TakeTouched()); missed != "" {
				t.Fatalf("seed %d change %d (%s): changed but not in Touched: %s", seed, i, what, missed)
			}
			if got, want := m.Table().Dump(), c.fresh(t)["n1"].Table().Dump(); got != want {
				t.Fatalf("seed %d change %d (%s): incremental table differs from a fresh build:\n%s", seed, i, what, lineDiff(want, got))
			}
		}
		c.checkTieredTruthTable(t, c.models, outside)
		if t.Failed() {
			t.Fatalf("seed %d", seed)
		}
	}
}

func (g gen) tieredChange(t testing.TB, c *tiered) string {
	switch g.r.IntN(4) {
	case 0:
		p := g.cnp(g.pick("c0", "c1", "c2", "c3"))
		c.setCNP(t, p)
		return "cnp " + p.Name
	case 1:
		name := g.pick("c0", "c1", "c2", "c3")
		c.deleteCNP(name)
		return "cnp " + name + " deleted"
	case 2:
		n := g.cnpNodes()[g.r.IntN(2)]
		c.setNode(n)
		return "node " + n.Name
	}
	return g.change(t, c.cluster)
}

func (c *tiered) describeCNPs() string {
	var b strings.Builder
	b.WriteString(c.describePolicies())
	for _, p := range c.cnps {
		fmt.Fprintf(&b, "%s %s/%d subject %v\n", p.Name, p.Spec.Tier, p.Spec.Priority, p.Spec.Subject)
		for i, r := range p.Spec.Ingress {
			fmt.Fprintf(&b, "  ingress[%d] %s from %v protocols %v\n", i, r.Action, r.From, r.Protocols)
		}
		for i, r := range p.Spec.Egress {
			fmt.Fprintf(&b, "  egress[%d] %s to %v protocols %v\n", i, r.Action, r.To, r.Protocols)
		}
	}
	return b.String()
}
