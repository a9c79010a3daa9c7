package policy

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Random clusters and policies, in the manner of Cyclonus's generator but
// drawn at random: selectors of every operator over a small label space,
// peers of every form, ports numeric, ranged, named and protocol-only, pods
// whose named ports differ, finished pods, pods on two nodes.

type gen struct{ r *rand.Rand }

func (g gen) pick(s ...string) string { return s[g.r.IntN(len(s))] }

func (g gen) chance(p float64) bool { return g.r.Float64() < p }

var podLabels = map[string][]string{"pod": {"a", "b", "c", "d"}, "app": {"web", "db"}, "tier": {"fe", "be"}}
var nsLabels = map[string][]string{"ns": {"x", "y", "z"}, "team": {"red", "blue"}}

func (g gen) selector(space map[string][]string) *metav1.LabelSelector {
	s := &metav1.LabelSelector{}
	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range space {
			if !yield(k) {
				return
			}
		}
	})
	for range g.r.IntN(3) {
		k := keys[g.r.IntN(len(keys))]
		if g.chance(0.5) {
			if s.MatchLabels == nil {
				s.MatchLabels = map[string]string{}
			}
			s.MatchLabels[k] = g.pick(space[k]...)
			continue
		}
		ops := []metav1.LabelSelectorOperator{metav1.LabelSelectorOpIn, metav1.LabelSelectorOpNotIn, metav1.LabelSelectorOpExists, metav1.LabelSelectorOpDoesNotExist}
		req := metav1.LabelSelectorRequirement{Key: k, Operator: ops[g.r.IntN(len(ops))]}
		if req.Operator == metav1.LabelSelectorOpIn || req.Operator == metav1.LabelSelectorOpNotIn {
			req.Values = []string{g.pick(space[k]...)}
			if g.chance(0.5) {
				req.Values = append(req.Values, g.pick(space[k]...))
			}
		}
		s.MatchExpressions = append(s.MatchExpressions, req)
	}
	return s
}

func (g gen) labels(space map[string][]string) map[string]string {
	l := map[string]string{}
	for _, k := range slices.Sorted(maps.Keys(space)) { // in order: a seed gives one cluster
		if g.chance(0.6) {
			l[k] = g.pick(space[k]...)
		}
	}
	return l
}

// blocks are CIDRs with exceptions inside them, of both families.
var blocks = [][]string{{"10.0.0.0/16"}, {"10.0.0.0/16", "10.0.1.0/24"}, {"10.0.1.0/24", "10.0.1.2/32"},
	{"0.0.0.0/0", "10.0.0.0/8"}, {"192.0.2.0/24", "192.0.2.128/25"}, {"fd00::/64", "fd00::2:0/112"}, {"::/0"}}

func (g gen) peers() []netv1.NetworkPolicyPeer {
	if g.chance(0.25) {
		return nil
	}
	var out []netv1.NetworkPolicyPeer
	for range 1 + g.r.IntN(2) {
		switch g.r.IntN(4) {
		case 0:
			out = append(out, podPeer(g.selector(podLabels)))
		case 1:
			out = append(out, nsPeer(g.selector(nsLabels)))
		case 2:
			out = append(out, bothPeer(g.selector(nsLabels), g.selector(podLabels)))
		default:
			b := blocks[g.r.IntN(len(blocks))]
			out = append(out, blockPeer(b[0], b[1:]...))
		}
	}
	return out
}

func (g gen) ports() []netv1.NetworkPolicyPort {
	if g.chance(0.3) {
		return nil
	}
	var out []netv1.NetworkPolicyPort
	for range 1 + g.r.IntN(2) {
		proto := protocols[g.r.IntN(len(protocols))]
		switch g.r.IntN(4) {
		case 0:
			out = append(out, port(proto, int32(79+g.r.IntN(4))))
		case 1:
			from := int32(79 + g.r.IntN(3))
			out = append(out, portRange(proto, from, from+int32(g.r.IntN(3))))
		case 2:
			out = append(out, namedPort(proto, g.pick("serve-80-tcp", "serve-81-udp", "serve-80-sctp", "web")))
		default:
			out = append(out, netv1.NetworkPolicyPort{Protocol: &proto})
		}
	}
	return out
}

func (g gen) policy(name string) *netv1.NetworkPolicy {
	spec := netv1.NetworkPolicySpec{PodSelector: *g.selector(podLabels)}
	for range g.r.IntN(3) {
		spec.Ingress = append(spec.Ingress, ingress(g.peers(), g.ports()...))
	}
	for range g.r.IntN(3) {
		spec.Egress = append(spec.Egress, egress(g.peers(), g.ports()...))
	}
	switch g.r.IntN(4) {
	case 0:
		spec.PolicyTypes = ingressOnly
	case 1:
		spec.PolicyTypes = egressOnly
	case 2:
		spec.PolicyTypes = bothTypes
	}
	return policy(g.pick(modelNamespaces...), name, spec)
}

// pod is the model's pod with random labels, node, phase and named ports.
func (g gen) pod(ns, name string) *v1.Pod {
	p := modelPod(ns, name)
	p.Labels = g.labels(podLabels)
	p.Spec.NodeName = g.pick("n1", "n2")
	if g.chance(0.1) {
		p.Status.Phase = v1.PodSucceeded
	}
	for i := range p.Spec.Containers {
		cp := &p.Spec.Containers[i].Ports[0]
		if g.chance(0.2) {
			cp.Name = g.pick("serve-80-tcp", "serve-81-udp", "web")
		}
	}
	return p
}

func (g gen) namespace(name string) *v1.Namespace {
	ns := modelNamespace(name)
	for k, v := range g.labels(nsLabels) {
		ns.Labels[k] = v
	}
	return ns
}

func TestRandomPoliciesMatchTheAPI(t *testing.T) {
	for seed := range uint64(150) {
		g := gen{rand.New(rand.NewPCG(seed, 1))}
		c := newCluster([]string{"n1", "n2"}, nil)
		for _, ns := range modelNamespaces {
			c.setNamespace(g.namespace(ns))
			for _, name := range modelPods {
				c.setPod(g.pod(ns, name))
			}
		}
		for i := range 1 + g.r.IntN(4) {
			c.setPolicy(t, g.policy(fmt.Sprint("p", i)))
		}
		c.checkTruthTable(t, c.models, outside)
		if t.Failed() {
			t.Fatalf("seed %d; policies:\n%s", seed, c.describePolicies())
		}
	}
}

// TestRandomChangesKeepTheIncrementalTableRight applies random changes one
// by one and checks after each that the incremental table equals one built
// afresh and that Touched names every difference from the table before.
func TestRandomChangesKeepTheIncrementalTableRight(t *testing.T) {
	randomChanges(t, 60, 2, gen.change, func(c *cluster) error {
		if got, want := c.models["n1"].Table().Dump(), c.fresh(t)["n1"].Table().Dump(); got != want {
			return fmt.Errorf("incremental table differs from a fresh build:\n%s", lineDiff(want, got))
		}
		return nil
	}, func(c *cluster) { c.checkTruthTable(t, c.models, outside) })
}

// randomChanges makes 60 changes by change to a new cluster for each of
// seeds, and checks after each that Touched names every difference from
// the table of n1 before it, and check; after the last, final.
func randomChanges(t *testing.T, seeds, stream uint64, change func(gen, testing.TB, *cluster) string, check func(*cluster) error, final func(*cluster)) {
	for seed := range seeds {
		g := gen{rand.New(rand.NewPCG(seed, stream))}
		c := newCluster([]string{"n1"}, nil)
		m := c.models["n1"]
		m.TakeTouched()
		for i := range 60 {
			before := snapshot(m.Table())
			what := change(g, t, c)
			if missed := before.untouched(snapshot(m.Table()), m.TakeTouched()); missed != "" {
				t.Fatalf("seed %d change %d (%s): changed but not in Touched: %s", seed, i, what, missed)
			}
			if err := check(c); err != nil {
				t.Fatalf("seed %d change %d (%s): %v", seed, i, what, err)
			}
		}
		final(c)
		if t.Failed() {
			t.Fatalf("seed %d", seed)
		}
	}
}

// change makes one random change to the cluster and says which.
func (g gen) change(t testing.TB, c *cluster) string {
	ns, name := g.pick(modelNamespaces...), g.pick("a", "b", "c", "d")
	switch g.r.IntN(6) {
	case 0:
		c.setNamespace(g.namespace(ns))
		return "namespace " + ns
	case 1:
		c.deleteNamespace(ns)
		return "namespace " + ns + " deleted"
	case 2:
		c.deletePod(podKey(ns, name))
		return "pod " + ns + "/" + name + " deleted"
	case 3:
		np := g.policy(g.pick("p1", "p2", "p3", "p4"))
		c.setPolicy(t, np)
		return "policy " + np.Namespace + "/" + np.Name
	case 4:
		key := podKey(ns, g.pick("p1", "p2", "p3", "p4"))
		c.deletePolicy(key)
		return "policy " + key.String() + " deleted"
	}
	p := g.pod(ns, name)
	p.Spec.NodeName = "n1"
	if g.chance(0.2) {
		p.Status.PodIPs = p.Status.PodIPs[:1] // an address change
	}
	c.setPod(p)
	return "pod " + ns + "/" + name
}

func (c *cluster) describePolicies() string {
	var b strings.Builder
	for _, np := range c.policies {
		fmt.Fprintf(&b, "%s/%s: %+v\n", np.Namespace, np.Name, np.Spec)
	}
	return b.String()
}

// tableState is a table as comparable parts.
type tableState struct {
	chains map[string]string
	elems  map[string]map[Element]bool // nil for no such set
}

func snapshot(t *Table) tableState {
	s := tableState{chains: map[string]string{}, elems: map[string]map[Element]bool{}}
	for name, c := range t.Chains {
		var rules []string
		for _, r := range c.Rules {
			rules = append(rules, r.Text())
		}
		s.chains[name] = strings.Join(rules, "\n")
	}
	for name, set := range t.Sets {
		s.elems[name] = map[Element]bool{}
		for e := range set.All() {
			s.elems[name][e] = true
		}
	}
	return s
}

// untouched names a difference between s and after that touched misses.
func (s tableState) untouched(after tableState, touched *Touched) string {
	for _, name := range unionKeys(s.chains, after.chains) {
		a, okA := s.chains[name]
		b, okB := after.chains[name]
		if (a != b || okA != okB) && !touched.Chains[name] {
			return "chain " + name
		}
	}
	for _, name := range unionKeys(s.elems, after.elems) {
		a, b := s.elems[name], after.elems[name]
		if (a == nil) != (b == nil) {
			if !touched.Sets[name] {
				return "set " + name
			}
			continue
		}
		if touched.Sets[name] {
			continue
		}
		for _, e := range unionKeys(a, b) {
			if a[e] != b[e] && !touched.Elems[name][e] {
				return fmt.Sprintf("element %+v of %s", e, name)
			}
		}
	}
	return ""
}

func unionKeys[K comparable, V any](a, b map[K]V) []K {
	var out []K
	for k := range a {
		out = append(out, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			out = append(out, k)
		}
	}
	return out
}
