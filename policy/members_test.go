package policy

import (
	"fmt"
	"strings"
	"testing"

	"github.com/netplane/netplane/nodeview"
)

// TestSelectorSetsHoldTheirPodsAddresses checks the sets a selector
// derives from its members against elements worked out from the records
// alone, after each of random changes that also give pods the address of
// another pod (a finished pod's address reused, a record late): every
// element is yielded once, Has agrees, and no other pod's address or port
// is in; Touched names every change and the sets equal fresh ones.
func TestSelectorSetsHoldTheirPodsAddresses(t *testing.T) {
	change := func(g gen, t testing.TB, c *cluster) string {
		what := g.change(t, c)
		if g.chance(0.3) {
			what += "; " + g.shareAddress(c)
		}
		return what
	}
	randomChanges(t, 40, 5, change, func(c *cluster) error {
		if err := checkDerivedSets(c.models["n1"]); err != nil {
			return err
		}
		// Only the peer sets: which of two pods of one address is enforced
		// depends on their order (Model.claims).
		if got, want := peerSets(c.models["n1"].Table()), peerSets(c.fresh(t)["n1"].Table()); got != want {
			return fmt.Errorf("incremental sets differ from a fresh build:\n%s", lineDiff(want, got))
		}
		return nil
	}, func(*cluster) {})
}

// shareAddress gives a pod the addresses of another pod of the cluster.
func (g gen) shareAddress(c *cluster) string {
	ns, name := g.pick(modelNamespaces...), g.pick("a", "b", "c", "d")
	from := c.pods[podKey(g.pick(modelNamespaces...), g.pick("a", "b", "c", "d"))]
	if from == nil {
		return "no address shared"
	}
	p := g.pod(ns, name)
	p.Status.PodIPs = from.Status.PodIPs
	c.setPod(p)
	return fmt.Sprintf("pod %s/%s with the addresses of %s/%s", ns, name, from.Namespace, from.Name)
}

// checkDerivedSets compares each selector's sets with the elements of the
// active pods its selector selects, found by scanning every pod.
func checkDerivedSets(m *Model) error {
	for _, s := range m.sels {
		want := map[string]map[Element]bool{}
		for _, f := range m.fams {
			want[setName("sel", f, s.hash)] = map[Element]bool{}
			for _, n := range s.named {
				want[setName("nport", f, n.hash)] = map[Element]bool{}
			}
		}
		var others []Element
		for _, st := range m.ns {
			inNS := s.ps.Namespaces == nil && st.name == s.ps.Namespace || s.ps.Namespaces != nil && s.ps.Namespaces.Matches(labelsOf(st))
			for _, p := range st.pods {
				selected := inNS && p.rec.active() && s.ps.Pods.Matches(p.labels())
				for _, a := range p.rec.IPs {
					e := Element{Addr: a}
					for _, port := range p.rec.Ports {
						pe := Element{Addr: a, Proto: port.Protocol, Port: port.Port}
						if n := s.named[port.Name]; n != nil && selected {
							want[setName("nport", nodeview.FamilyOf(a), n.hash)][pe] = true
						} else {
							others = append(others, pe)
						}
					}
					if selected {
						want[setName("sel", nodeview.FamilyOf(a), s.hash)][e] = true
					} else {
						others = append(others, e)
					}
				}
			}
		}
		for name, w := range want {
			if err := compareSet(m.t.Sets[name], w, others); err != nil {
				return fmt.Errorf("%s (%s): %v", name, s.ps.Key, err)
			}
		}
	}
	return nil
}

func compareSet(set *Set, want map[Element]bool, others []Element) error {
	got := map[Element]bool{}
	for e := range set.All() {
		if got[e] {
			return fmt.Errorf("%+v yielded twice", e)
		}
		got[e] = true
		if !want[e] {
			return fmt.Errorf("holds %+v", e)
		}
	}
	for e := range want {
		if !got[e] || !set.Has(e) {
			return fmt.Errorf("lacks %+v (yielded %v)", e, got[e])
		}
	}
	for _, e := range others {
		if !want[e] && set.Has(e) {
			return fmt.Errorf("Has(%+v) of no member", e)
		}
	}
	if set.Len() != len(want) {
		return fmt.Errorf("Len %d, want %d", set.Len(), len(want))
	}
	return nil
}

// peerSets is the dump of the table's selector and named-port sets.
func peerSets(t *Table) string {
	var lines []string
	for _, line := range strings.Split(t.Dump(), "\n") {
		if strings.Contains(line, " sel") || strings.Contains(line, " nport") {
			lines = append(lines, line)
		}
	}
	return strings.Join(lines, "\n")
}
