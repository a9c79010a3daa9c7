package explain

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/netplane/netplane/nft"
	"github.com/netplane/netplane/policy"
	"github.com/netplane/netplane/proxy"
)

// The verdict is the policy model's: each node's desired table, built by
// policy.Model from the pods the question names, traced for the packet
// (policy.Table.Trace) as the kernel would run it. Which policy isolates
// and which rule allows is read from the compiled policies beside it, to
// name them; the two are checked against each other.

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
	slices.SortFunc(j.policies, func(a, b *policy.Policy) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
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
	// traced is the model's verdict, which decides; mismatch notes where
	// the reading of the rules disagrees with it.
	mismatch string
}

// decide judges a connection from src to dst on proto/port (after DNAT):
// egress on src's node, ingress on dst's.
func (j *judge) decide(src, dst end, proto uint8, port uint16) decision {
	var d decision
	var egressEff, ingressEff []PolicyEffect
	d.egressOK, d.egress, egressEff = j.readTiered(src, dst, proto, port, policy.Egress)
	d.ingressOK, d.ingress, ingressEff = j.readTiered(dst, src, proto, port, policy.Ingress)
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
		d.mismatch = fmt.Sprintf("the policy model's table says egress %v, ingress %v; the rules read egress %v, ingress %v",
			traced[policy.Egress], traced[policy.Ingress], d.egressOK, d.ingressOK)
		d.egressOK, d.ingressOK = traced[policy.Egress], traced[policy.Ingress]
	}
	return d
}

// read judges one direction at the end self (the source for egress, the
// destination for ingress) against the peer, from the compiled policies.
func (j *judge) read(self, peer end, proto uint8, port uint16, dir policy.Direction) (bool, string, []PolicyEffect) {
	dirName := DirIngress
	if dir == policy.Egress {
		dirName = DirEgress
	}
	if self.pod == nil || !enforced(self.pod) {
		return true, "not isolated (" + notEnforced(self) + ")", nil
	}
	dstPod := self.pod // named ports resolve on the destination pod
	if dir == policy.Egress {
		dstPod = peer.pod
	}
	var isolating []string
	var effects []PolicyEffect
	allowedBy := ""
	for _, p := range j.policies {
		if p.Namespace != self.pod.Namespace || !p.PodSelector.Matches(labels.Set(self.pod.Labels)) {
			continue
		}
		if (dir == policy.Egress && !p.Egress) || (dir == policy.Ingress && !p.Ingress) {
			continue
		}
		name := p.Namespace + "/" + p.Name
		isolating = append(isolating, name)
		effects = append(effects, PolicyEffect{Namespace: p.Namespace, Name: p.Name, Direction: dirName, Effect: Isolates})
		rules := p.IngressRules
		if dir == policy.Egress {
			rules = p.EgressRules
		}
		for i, r := range rules {
			if j.ruleAllows(r, p.Namespace, peer, dstPod, proto, port) {
				effects = append(effects, PolicyEffect{Namespace: p.Namespace, Name: p.Name, Direction: dirName, Effect: Allows, Rule: i + 1})
				if allowedBy == "" {
					allowedBy = fmt.Sprintf("allowed by %s (rule %d)", name, i+1)
				}
				break
			}
		}
	}
	switch {
	case len(isolating) == 0:
		return true, "not isolated", nil
	case allowedBy != "":
		return true, allowedBy, effects
	}
	verb := "to"
	if dir == policy.Ingress {
		verb = "from"
	}
	return false, fmt.Sprintf("denied: isolated by %s, no rule allows %s/%d %s %s",
		strings.Join(isolating, ", "), nft.ProtoName(proto), port, verb, peer), effects
}

// ruleAllows: one of the rule's peers is peer and one of its ports is
// proto/port (a named port as dstPod names it).
func (j *judge) ruleAllows(r policy.PolicyRule, ns string, peer end, dstPod *policy.Pod, proto uint8, port uint16) bool {
	peerOK := len(r.Peers) == 0
	for _, p := range r.Peers {
		if j.peerMatches(p, peer) {
			peerOK = true
			break
		}
	}
	if !peerOK {
		return false
	}
	if len(r.Ports) == 0 {
		return true
	}
	for _, p := range r.Ports {
		if p.Protocol != proto {
			continue
		}
		switch {
		case p.Name != "":
			if dstPod != nil && enforcedPeer(dstPod) && slices.ContainsFunc(dstPod.Ports, func(np policy.NamedPort) bool {
				return np.Name == p.Name && np.Protocol == proto && np.Port == port
			}) {
				return true
			}
		case p.Port == 0 || (port >= p.Port && port <= p.EndPort):
			return true
		}
	}
	return false
}

func (j *judge) peerMatches(p policy.Peer, peer end) bool {
	switch {
	case p.Block != nil:
		for _, r := range p.Block.Ranges {
			if r.Contains(peer.ip) {
				return true
			}
		}
		return false
	case p.Pods != nil:
		if peer.pod == nil || !enforcedPeer(peer.pod) {
			return false
		}
		ps := p.Pods
		if ps.Namespaces == nil {
			if peer.pod.Namespace != ps.Namespace {
				return false
			}
		} else {
			n := j.ns[peer.pod.Namespace]
			if n == nil || !ps.Namespaces.Matches(labels.Set(n.Labels)) {
				return false
			}
		}
		return ps.Pods.Matches(labels.Set(peer.pod.Labels))
	}
	return true
}

// enforced: policy applies to the pod (policy.Pod's own rule: an address
// of its own, not hostNetwork, not finished).
func enforced(p *policy.Pod) bool { return !p.HostNetwork && !p.Terminal && len(p.IPs) > 0 }

// enforcedPeer: selectors can select the pod (the same rule).
func enforcedPeer(p *policy.Pod) bool { return enforced(p) }

func notEnforced(e end) string {
	switch {
	case e.pod == nil:
		return e.ip.String() + " is no pod"
	case e.pod.HostNetwork:
		return "hostNetwork pods are not enforced"
	case e.pod.Terminal:
		return "the pod has finished"
	}
	return "the pod has no address"
}

// protoNumber is the IP protocol of an API protocol name.
func protoNumber(p v1.Protocol) uint8 { return proxy.ProtocolNumber(p) }
