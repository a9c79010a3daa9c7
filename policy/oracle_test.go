package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/netplane/netplane/nodeview"
)

// This file holds the reference: a straight reading of the NetworkPolicy
// API (allowed), with no sets, groups or incremental state, and a cluster
// of API objects that feeds one Model per node as it changes, so tests
// compare what the models' tables do to packets (Table.Trace) with it.

// cluster is API objects and the models of its nodes.
type cluster struct {
	namespaces map[string]*v1.Namespace
	pods       map[types.NamespacedName]*v1.Pod
	policies   map[types.NamespacedName]*netv1.NetworkPolicy
	models     map[string]*Model // by node
	fams       []nodeview.Family
}

func newCluster(nodes []string, fams []nodeview.Family) *cluster {
	c := &cluster{namespaces: map[string]*v1.Namespace{}, pods: map[types.NamespacedName]*v1.Pod{},
		policies: map[types.NamespacedName]*netv1.NetworkPolicy{}, models: map[string]*Model{}, fams: fams}
	for _, n := range nodes {
		c.models[n] = NewModel(Config{Node: n, Families: fams})
	}
	return c
}

func (c *cluster) setNamespace(ns *v1.Namespace) {
	c.namespaces[ns.Name] = ns
	for _, m := range c.models {
		m.UpsertNamespace(NamespaceFromAPI(ns))
	}
}

func (c *cluster) deleteNamespace(name string) {
	delete(c.namespaces, name)
	for _, m := range c.models {
		m.DeleteNamespace(name)
	}
}

func (c *cluster) setPod(p *v1.Pod) {
	c.pods[types.NamespacedName{Namespace: p.Namespace, Name: p.Name}] = p
	for _, m := range c.models {
		m.UpsertPod(PodFromAPI(p))
	}
}

func (c *cluster) deletePod(key types.NamespacedName) {
	delete(c.pods, key)
	for _, m := range c.models {
		m.DeletePod(key)
	}
}

func (c *cluster) setPolicy(t testing.TB, np *netv1.NetworkPolicy) {
	t.Helper()
	pol, err := Compile(np)
	if err != nil {
		t.Fatalf("compile %s/%s: %v", np.Namespace, np.Name, err)
	}
	c.policies[pol.Key()] = np
	for _, m := range c.models {
		m.UpsertPolicy(pol)
	}
}

func (c *cluster) deletePolicy(key types.NamespacedName) {
	delete(c.policies, key)
	for _, m := range c.models {
		m.DeletePolicy(key)
	}
}

// fresh builds each node's model again from the current objects alone.
func (c *cluster) fresh(t testing.TB) map[string]*Model {
	t.Helper()
	out := map[string]*Model{}
	for node := range c.models {
		m := NewModel(Config{Node: node, Families: c.fams})
		for _, ns := range c.namespaces {
			m.UpsertNamespace(NamespaceFromAPI(ns))
		}
		for _, np := range c.policies {
			pol, err := Compile(np)
			if err != nil {
				t.Fatal(err)
			}
			m.UpsertPolicy(pol)
		}
		for _, p := range c.pods {
			m.UpsertPod(PodFromAPI(p))
		}
		out[node] = m
	}
	return out
}

// endpoint is one end of a connection: a pod's address, or an address
// outside the cluster (pod nil).
type endpoint struct {
	pod *v1.Pod
	ip  netip.Addr
}

func (e endpoint) String() string {
	if e.pod == nil {
		return e.ip.String()
	}
	return e.pod.Namespace + "/" + e.pod.Name + "(" + e.ip.String() + ")"
}

// allowed is the API's answer: may from open a connection to port/proto
// of to? Both the source's egress and the destination's ingress must allow.
func (c *cluster) allowed(from, to endpoint, port int32, proto v1.Protocol) bool {
	return c.directionAllows(netv1.PolicyTypeEgress, from, to, to, port, proto) &&
		c.directionAllows(netv1.PolicyTypeIngress, to, from, to, port, proto)
}

// directionAllows: for self (the pod whose policies count) in direction
// dir, with peer at the other end and dst the destination.
func (c *cluster) directionAllows(dir netv1.PolicyType, self, peer, dst endpoint, port int32, proto v1.Protocol) bool {
	isolated := false
	for _, np := range c.isolating(dir, self) {
		isolated = true
		if c.firstRule(np, dir, peer, dst, port, proto) >= 0 {
			return true
		}
	}
	return !isolated
}

// isolating are the policies isolating self in direction dir, by name;
// none for a pod no one enforces.
func (c *cluster) isolating(dir netv1.PolicyType, self endpoint) []*netv1.NetworkPolicy {
	if self.pod == nil || self.pod.Spec.HostNetwork || terminal(self.pod) {
		return nil
	}
	var out []*netv1.NetworkPolicy
	for _, np := range c.policies {
		if np.Namespace == self.pod.Namespace && hasType(np, dir) && selects(&np.Spec.PodSelector, self.pod.Labels) {
			out = append(out, np)
		}
	}
	slices.SortFunc(out, func(a, b *netv1.NetworkPolicy) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// firstRule is the place of the first rule of np in direction dir that
// allows the connection; -1 for none.
func (c *cluster) firstRule(np *netv1.NetworkPolicy, dir netv1.PolicyType, peer, dst endpoint, port int32, proto v1.Protocol) int {
	if dir == netv1.PolicyTypeIngress {
		return slices.IndexFunc(np.Spec.Ingress, func(r netv1.NetworkPolicyIngressRule) bool {
			return c.peersMatch(r.From, np.Namespace, peer) && portsMatch(r.Ports, dst, port, proto)
		})
	}
	return slices.IndexFunc(np.Spec.Egress, func(r netv1.NetworkPolicyEgressRule) bool {
		return c.peersMatch(r.To, np.Namespace, peer) && portsMatch(r.Ports, dst, port, proto)
	})
}

func terminal(p *v1.Pod) bool {
	return p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed
}

func hasType(np *netv1.NetworkPolicy, dir netv1.PolicyType) bool {
	if len(np.Spec.PolicyTypes) == 0 {
		return dir == netv1.PolicyTypeIngress || len(np.Spec.Egress) > 0
	}
	return slices.Contains(np.Spec.PolicyTypes, dir)
}

func selects(s *metav1.LabelSelector, l map[string]string) bool {
	sel, err := metav1.LabelSelectorAsSelector(s)
	if err != nil {
		panic(err)
	}
	return sel.Matches(labels.Set(l))
}

func (c *cluster) peersMatch(peers []netv1.NetworkPolicyPeer, policyNS string, e endpoint) bool {
	if len(peers) == 0 {
		return true
	}
	for _, p := range peers {
		if p.IPBlock != nil {
			if inBlock(p.IPBlock, e.ip) {
				return true
			}
			continue
		}
		if e.pod == nil || e.pod.Spec.HostNetwork || terminal(e.pod) {
			continue
		}
		nsOK := e.pod.Namespace == policyNS
		if p.NamespaceSelector != nil {
			var l map[string]string
			if ns := c.namespaces[e.pod.Namespace]; ns != nil {
				l = ns.Labels
			}
			nsOK = selects(p.NamespaceSelector, l)
		}
		if nsOK && (p.PodSelector == nil || selects(p.PodSelector, e.pod.Labels)) {
			return true
		}
	}
	return false
}

func inBlock(b *netv1.IPBlock, a netip.Addr) bool {
	if !netip.MustParsePrefix(b.CIDR).Contains(a) {
		return false
	}
	for _, e := range b.Except {
		if netip.MustParsePrefix(e).Contains(a) {
			return false
		}
	}
	return true
}

func portsMatch(ports []netv1.NetworkPolicyPort, dst endpoint, port int32, proto v1.Protocol) bool {
	if len(ports) == 0 {
		return true
	}
	for _, p := range ports {
		pp := v1.ProtocolTCP
		if p.Protocol != nil {
			pp = *p.Protocol
		}
		switch {
		case pp != proto:
		case p.Port == nil:
			return true
		case p.Port.Type == intstr.String:
			// A finished pod's address may be another's: it matches nothing.
			if dst.pod != nil && !terminal(dst.pod) && !dst.pod.Spec.HostNetwork && podServes(dst.pod, p.Port.StrVal, port, proto) {
				return true
			}
		case p.EndPort == nil:
			if p.Port.IntVal == port {
				return true
			}
		default:
			if p.Port.IntVal <= port && port <= *p.EndPort {
				return true
			}
		}
	}
	return false
}

func podServes(p *v1.Pod, name string, port int32, proto v1.Protocol) bool {
	for _, ct := range p.Spec.Containers {
		for _, cp := range ct.Ports {
			cpProto := cp.Protocol
			if cpProto == "" {
				cpProto = v1.ProtocolTCP
			}
			if cp.Name == name && cpProto == proto && cp.ContainerPort == port {
				return true
			}
		}
	}
	return false
}

// judge is what the nodes' tables do to the first packet from → to: the
// source's node (its forward hook) and, if other, the destination's.
func (c *cluster) judge(models map[string]*Model, from, to endpoint, port uint16, proto uint8) (bool, []string) {
	var nodes []string
	if from.pod != nil && models[from.pod.Spec.NodeName] != nil {
		nodes = append(nodes, from.pod.Spec.NodeName)
	}
	if to.pod != nil && models[to.pod.Spec.NodeName] != nil && !slices.Contains(nodes, to.pod.Spec.NodeName) {
		nodes = append(nodes, to.pod.Spec.NodeName)
	}
	var steps []string
	for _, n := range nodes {
		tr := models[n].Table().Trace(Packet{Hook: "forward", Src: from.ip, Dst: to.ip, Proto: proto, Port: port})
		for _, s := range tr.Steps {
			steps = append(steps, n+" "+s)
		}
		if !tr.Accepted {
			return false, steps
		}
	}
	return true, steps
}

// probe is one connection of the truth table.
type probe struct {
	from, to endpoint
	port     int32
	proto    v1.Protocol
}

func (p probe) String() string {
	return fmt.Sprintf("%s -> %s %s/%d", p.from, p.to, strings.ToLower(string(p.proto)), p.port)
}

var protocols = []v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP}

// probes is every pod to every other pod and to the outside addresses,
// and the outside addresses to every pod, on ports 80 and 81 of each
// protocol, in each family.
func (c *cluster) probes(outside []netip.Addr) []probe {
	var eps []endpoint
	for _, p := range c.pods {
		for _, a := range PodFromAPI(p).IPs {
			eps = append(eps, endpoint{pod: p, ip: a})
		}
	}
	for _, a := range outside {
		eps = append(eps, endpoint{ip: a})
	}
	sort.Slice(eps, func(i, j int) bool { return eps[i].String() < eps[j].String() })
	var out []probe
	for _, from := range eps {
		for _, to := range eps {
			if from.ip.Is4() != to.ip.Is4() || (from.pod == nil && to.pod == nil) || (from.pod != nil && from.pod == to.pod) {
				continue // a pod reaching itself never leaves it
			}
			for _, proto := range protocols {
				for _, port := range []int32{80, 81} {
					out = append(out, probe{from, to, port, proto})
				}
			}
		}
	}
	return out
}

// checkTruthTable compares the models' verdicts, those of their tables
// and those of their traces, with the API's on every probe, and fails with
// the first mismatches and their traces.
func (c *cluster) checkTruthTable(t *testing.T, models map[string]*Model, outside []netip.Addr) {
	t.Helper()
	bad := 0
	for _, pr := range c.probes(outside) {
		proto, _ := protocolNumber(pr.proto)
		want := c.allowed(pr.from, pr.to, pr.port, pr.proto)
		got, steps := c.judge(models, pr.from, pr.to, uint16(pr.port), proto)
		if got != want {
			if bad++; bad <= 5 {
				t.Errorf("%s: API says allowed=%v, tables say %v; trace:\n  %s", pr, want, got, strings.Join(steps, "\n  "))
			}
		}
		for _, d := range directions {
			if msg := c.checkTrace(models, pr, d); msg != "" {
				if bad++; bad <= 5 {
					t.Errorf("%s %s: %s", pr, d, msg)
				}
			}
		}
	}
	if bad > 5 {
		t.Errorf("... %d mismatches in all", bad)
	}
}

// checkTrace compares the model's trace of one direction of a probe (the
// verdict, each isolating policy and its first allowing rule) with the
// API's reading; "" when they agree.
func (c *cluster) checkTrace(models map[string]*Model, pr probe, d Direction) string {
	proto, _ := protocolNumber(pr.proto)
	got, ok := traced(models, pr.from, pr.to, uint16(pr.port), proto, d)
	if !ok {
		return ""
	}
	self, peer, dir := pr.to, pr.from, netv1.PolicyTypeIngress
	if d == Egress {
		self, peer, dir = pr.from, pr.to, netv1.PolicyTypeEgress
	}
	var want []Isolation
	for _, np := range c.isolating(dir, self) {
		want = append(want, Isolation{Policy: podKey(np.Namespace, np.Name), Rule: c.firstRule(np, dir, peer, pr.to, pr.port, pr.proto)})
	}
	if allowed := c.directionAllows(dir, self, peer, pr.to, pr.port, pr.proto); got.Allowed != allowed || !slices.Equal(got.Isolations, want) {
		return fmt.Sprintf("API says allowed=%v, isolations %v; the trace says allowed=%v, isolations %v", allowed, want, got.Allowed, got.Isolations)
	}
	return ""
}

// traced is the model's trace of direction d of a connection, on the node
// of the pod whose policies count; false when that is no pod of the
// models' nodes.
func traced(models map[string]*Model, from, to endpoint, port uint16, proto uint8, d Direction) (Decision, bool) {
	self, peer := to, from
	if d == Egress {
		self, peer = from, to
	}
	if self.pod == nil || models[self.pod.Spec.NodeName] == nil {
		return Decision{}, false
	}
	return models[self.pod.Spec.NodeName].Trace(Flow{Dir: d, Pod: podKey(self.pod.Namespace, self.pod.Name), Peer: peer.ip, Proto: proto, Port: port}), true
}

// traceAllows is what the models' traces say of a connection: the
// source's egress on its node and the destination's ingress on its node.
func traceAllows(models map[string]*Model, from, to endpoint, port uint16, proto uint8) bool {
	for _, d := range directions {
		if dec, ok := traced(models, from, to, port, proto, d); ok && !dec.Allowed {
			return false
		}
	}
	return true
}
