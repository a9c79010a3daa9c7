package explain

import (
	"fmt"
	"net/netip"
	"strings"

	v1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"

	"github.com/netplane/netplane/nft"
	"github.com/netplane/netplane/policy"
	"github.com/netplane/netplane/proxy"
)

// The verdict is the policy model's: each node's model, built by
// policy.Model from the pods the question names, says for each direction
// which tier, policy and rule decide (policy.Model.Trace, run on the
// compiled rules its chains are made of); its desired table, traced for the
// packet through the node's hooks (policy.Table.Trace), is checked against
// it. Explain judges nothing with code of its own.

// end is one end of a connection as policy sees it: a pod, or a bare
// address (an external client, a node).
type end struct {
	pod  *policy.Pod // nil for a bare address
	ip   netip.Addr
	node string // the pod's node, or the node whose address ip is
}

func (e end) String() string {
	if e.pod != nil {
		return "pod " + e.pod.Namespace + "/" + e.pod.Name
	}
	return e.ip.String()
}

// judge holds the objects of one question, compiled once, and the policy
// model of each node it was asked about.
type judge struct {
	pods     []*policy.Pod
	ns       map[string]*policy.Namespace
	policies []*policy.Policy
	models   map[string]*policy.Model
	cnps     []*policy.ClusterPolicy // cnp.go
	nodes    []*policy.Node
}

func newJudge(pods []*v1.Pod, nss []*v1.Namespace, nps []*netv1.NetworkPolicy) (*judge, error) {
	j := &judge{ns: map[string]*policy.Namespace{}, models: map[string]*policy.Model{}}
	seen := map[string]bool{}
	for _, p := range pods {
		if k := p.Namespace + "/" + p.Name; !seen[k] {
			seen[k] = true
			j.pods = append(j.pods, policy.PodFromAPI(p))
		}
	}
	for _, n := range nss {
		j.ns[n.Name] = policy.NamespaceFromAPI(n)
	}
	for _, np := range nps {
		c, err := policy.Compile(np)
		if err != nil {
			// The nodes keep the previous version in force; we have none.
			return nil, fmt.Errorf("%v (the nodes keep its previous version in force, which explain cannot know)", err)
		}
		j.policies = append(j.policies, c)
	}
	return j, nil
}

// model is the policy model of node, holding the question's objects.
func (j *judge) model(node string) *policy.Model {
	if m := j.models[node]; m != nil {
		return m
	}
	m := policy.NewModel(policy.Config{Node: node})
	for _, n := range j.ns {
		m.UpsertNamespace(n)
	}
	for _, p := range j.pods {
		m.UpsertPod(p)
	}
	for _, p := range j.policies {
		m.UpsertPolicy(p)
	}
	for _, n := range j.nodes {
		m.UpsertNode(n)
	}
	for _, p := range j.cnps {
		m.UpsertClusterPolicy(p)
	}
	j.models[node] = m
	return m
}

// decision is what policy does to one connection.
type decision struct {
	egressOK, ingressOK bool
	egress, ingress     string // in words
	effects             []PolicyEffect
	// The verdict is the model's table's, traced through the node's hooks;
	// mismatch notes where the engine's trace of the rules disagrees.
	mismatch string
}

// decide judges a connection from src to dst on proto/port (after DNAT):
// egress on src's node, ingress on dst's.
func (j *judge) decide(src, dst end, proto uint8, port uint16) decision {
	var d decision
	var egressEff, ingressEff []PolicyEffect
	d.egressOK, d.egress, egressEff = j.read(src, dst, proto, port, policy.Egress)
	d.ingressOK, d.ingress, ingressEff = j.read(dst, src, proto, port, policy.Ingress)
	d.effects = append(egressEff, ingressEff...)

	// The model's verdict: the forward hook of each end's node (input when
	// a pod connects to its own node's address; a node's own packets to
	// its pods meet no hook of the policy table).
	traced := map[policy.Direction]bool{policy.Egress: true, policy.Ingress: true}
	run := func(node, hook string) {
		tr := j.model(node).Table().Trace(policy.Packet{Hook: hook, Src: src.ip, Dst: dst.ip, Proto: proto, Port: port})
		for _, c := range tr.Counters {
			switch c {
			case policy.CounterName(policy.Egress):
				traced[policy.Egress] = false
			case policy.CounterName(policy.Ingress):
				traced[policy.Ingress] = false
			}
		}
	}
	switch {
	case src.pod != nil && dst.pod == nil && dst.node == src.node:
		run(src.node, "input") // a pod to its own node's address
	case src.pod != nil:
		run(src.node, "forward") // egress, and ingress when dst is on the same node
	}
	switch {
	case dst.pod == nil || (src.pod != nil && src.node == dst.node):
	case src.pod == nil && src.node == dst.node:
		// The node's own packets to its pods: output, which is not hooked.
		d.ingressOK, d.ingress, d.effects = true, "not judged: a node's own connections to its pods are always allowed", egressEff
	default:
		run(dst.node, "forward")
	}
	if traced[policy.Egress] != d.egressOK || traced[policy.Ingress] != d.ingressOK {
		d.mismatch = fmt.Sprintf("the policy model's table says egress %v, ingress %v; its trace of the rules egress %v, ingress %v",
			traced[policy.Egress], traced[policy.Ingress], d.egressOK, d.ingressOK)
		d.egressOK, d.ingressOK = traced[policy.Egress], traced[policy.Ingress]
	}
	return d
}

// read judges one direction at the end self (the source for egress, the
// destination for ingress) against the peer: the policy engine's trace of
// the model of self's node (policy.Model.Trace), put in words. The tiers
// come in the order the pod's chains run them: Admin, then NetworkPolicy
// when a NetworkPolicy isolates self, else Baseline, else allowed.
func (j *judge) read(self, peer end, proto uint8, port uint16, dir policy.Direction) (bool, string, []PolicyEffect) {
	if self.pod == nil {
		return true, "not isolated (" + self.ip.String() + " is no pod)", nil
	}
	d := j.model(self.node).Trace(policy.Flow{Dir: dir, Pod: self.pod.Key(), Peer: peer.ip, Proto: proto, Port: port})
	if !d.Enforced {
		return true, "not isolated (" + notEnforced(self.pod, peer.ip) + ")", nil
	}
	dirName := DirIngress
	if dir == policy.Egress {
		dirName = DirEgress
	}
	var tiers []PolicyEffect
	passed := ""
	switch d.Admin.Action {
	case policy.ActionAccept, policy.ActionDeny:
		return d.Allowed, decidedBy(d.Admin), []PolicyEffect{clusterEffect(d.Admin, dirName)}
	case policy.ActionPass:
		tiers = append(tiers, clusterEffect(d.Admin, dirName))
		passed = "passed by " + clusterWords(d.Admin) + "; "
	}
	if d.Isolated() {
		words, effects := isolationWords(d, peer, proto, port, dirName)
		return d.Allowed, passed + words, append(tiers, effects...)
	}
	switch d.Baseline.Action {
	case policy.ActionAccept, policy.ActionDeny:
		return d.Allowed, passed + decidedBy(d.Baseline), append(tiers, clusterEffect(d.Baseline, dirName))
	case policy.ActionPass:
		return d.Allowed, passed + "passed by " + clusterWords(d.Baseline) + "; allowed by default",
			append(tiers, clusterEffect(d.Baseline, dirName))
	}
	return d.Allowed, passed + "not isolated", tiers
}

// isolationWords name the NetworkPolicies isolating the pod and the first
// rule allowing the flow, or that none does.
func isolationWords(d policy.Decision, peer end, proto uint8, port uint16, dirName string) (string, []PolicyEffect) {
	var isolating []string
	var effects []PolicyEffect
	allowedBy := ""
	for _, iso := range d.Isolations {
		name := iso.Policy.String()
		isolating = append(isolating, name)
		effects = append(effects, PolicyEffect{Namespace: iso.Policy.Namespace, Name: iso.Policy.Name, Direction: dirName, Effect: Isolates})
		if iso.Rule < 0 {
			continue
		}
		effects = append(effects, PolicyEffect{Namespace: iso.Policy.Namespace, Name: iso.Policy.Name, Direction: dirName, Effect: Allows, Rule: iso.Rule + 1})
		if allowedBy == "" {
			allowedBy = fmt.Sprintf("allowed by %s (rule %d)", name, iso.Rule+1)
		}
	}
	if allowedBy != "" {
		return allowedBy, effects
	}
	verb := "to"
	if dirName == DirIngress {
		verb = "from"
	}
	return fmt.Sprintf("denied: isolated by %s, no rule allows %s/%d %s %s",
		strings.Join(isolating, ", "), nft.ProtoName(proto), port, verb, peer), effects
}

// notEnforced says why policy does not judge the pod's side of a
// connection with peer.
func notEnforced(p *policy.Pod, peer netip.Addr) string {
	switch {
	case p.HostNetwork:
		return "hostNetwork pods are not enforced"
	case p.Terminal:
		return "the pod has finished"
	case len(p.IPs) == 0:
		return "the pod has no address"
	}
	return "the pod has no address of the family of " + peer.String()
}

// protoNumber is the IP protocol of an API protocol name.
func protoNumber(p v1.Protocol) uint8 { return proxy.ProtocolNumber(p) }
