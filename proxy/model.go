package proxy

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/types"

	"github.com/netplane/netplane/nft"
	"github.com/netplane/netplane/nodeview"
)

// Model builds desired rulesets incrementally. It remembers each Service's
// share of the ruleset (its fragment) and keeps the merged tables up to
// date by swapping only the fragments of Services whose objects changed, so
// the work per sync grows with the change, not with the cluster. Informer
// caches replace an object's pointer on every change and never modify it in
// place, so pointer equality means "unchanged".
type Model struct {
	nodeKey string
	node    NodeFacts
	frags   map[types.NamespacedName]*fragment
	// shared counts the Services using each shared chain, per family.
	shared map[nodeview.Family]map[string]int
	picks  *pickCache
	d      *Desired
	sum    summaries // behind d's Health, UDP and counts (summary.go)
	// touched is what changed in the merged tables since TakeTouched:
	// chains, sets of one Service (affinity) and elements of shared sets.
	// nil means everything (a reset).
	touched map[nodeview.Family]*nft.Touched
}

// TakeTouched returns, per family, what changed since the last call, and
// forgets it; nil after a reset (the node's facts changed: all is new).
func (m *Model) TakeTouched() map[nodeview.Family]*nft.Touched {
	t := m.touched
	m.touched = map[nodeview.Family]*nft.Touched{}
	for _, fam := range nodeview.Families {
		m.touched[fam] = nft.NewTouched()
	}
	if t == nil || m.frags == nil {
		return nil
	}
	return t
}

// fragment is everything one Service contributes to the desired ruleset.
// Once merged it forgets the elements it added to shared sets (a sixth of
// the model at 10,000 Services); removing it builds them again from the
// same records (sharedElems).
type fragment struct {
	svc    *serviceRecord
	slices []*sliceRecord
	d      *Desired // the Service's health-check, UDP and metric summaries; no tables
	parts  []fragPart
}

// fragPart is a fragment's share of one family's table, in slices rather
// than a Table's maps: at 10,000 Services the maps of the fragments' own
// tables were a fifth of the model's memory.
type fragPart struct {
	fam    nodeview.Family
	chains []*nft.Chain
	shared []*nft.Chain // shared chains it uses (pickChain)
	sets   []*nft.Set   // the Service's own sets (affinity)
	elems  []fragElem   // until merged (add), then nil
}

// NewModel returns a model with an empty cache.
func NewModel() *Model { return &Model{} }

// Build computes the desired ruleset. It is a pure function of in.
func Build(in Input) *Desired { return NewModel().Build(in) }

// Build returns the desired ruleset for in. The result is owned by the
// model and changed in place by the next Build: use it before calling again.
func (m *Model) Build(in Input) *Desired {
	if key := fmt.Sprintf("%+v", in.Node); key != m.nodeKey || m.d == nil {
		m.reset(key, in.Node)
	}
	changes := make(map[types.NamespacedName]Change, len(in.Services))
	for _, svc := range in.Services {
		changes[svc.key()] = Change{Svc: svc, Slices: in.Slices[svc.key()]}
	}
	for name := range m.frags {
		if _, ok := changes[name]; !ok {
			changes[name] = Change{} // gone
		}
	}
	return m.Apply(changes)
}

// Built reports whether the model holds a build for node: Apply needs one.
func (m *Model) Built(node NodeFacts) bool {
	return m.d != nil && fmt.Sprintf("%+v", node) == m.nodeKey
}

// Change is a Service's current record and slices; a nil svc means it is
// gone (or not proxied).
type Change struct {
	Svc    *serviceRecord
	Slices []*sliceRecord
}

// Apply is Build for the Services in changes only (Build is Apply of
// every Service), the others being as in the last build, which must be for
// the same node facts (Built). A partial
// sync then lists no caches and compares no unchanged fragments, and its
// summaries change by the changed fragments only (summary.go).
func (m *Model) Apply(changes map[types.NamespacedName]Change) *Desired {
	m.handedOut() // the last Desired's maps are the caller's
	var todo []Change
	var gone []*fragment
	for name, c := range changes {
		f := m.frags[name]
		if c.Svc == nil {
			if f != nil {
				gone = append(gone, f)
				delete(m.frags, name)
			}
			continue
		}
		if f != nil && f.svc == c.Svc && slices.Equal(f.slices, c.Slices) {
			continue
		}
		if f != nil {
			gone = append(gone, f)
		}
		todo = append(todo, c)
	}
	m.removeAll(gone)
	fresh := buildFragments(todo, m.node, m.picks)
	for _, f := range fresh {
		m.frags[f.svc.key()] = f
	}
	if len(fresh) > len(m.frags)/2 {
		m.reserve(fresh)
	}
	for _, f := range fresh {
		m.add(f)
		for i := range f.parts {
			f.parts[i].elems = nil
		}
	}
	return m.d
}

func (m *Model) reset(key string, node NodeFacts) {
	m.nodeKey, m.node = key, node
	m.touched = nil
	m.frags = map[types.NamespacedName]*fragment{}
	m.shared = map[nodeview.Family]map[string]int{}
	m.picks = newPickCache(node)
	m.d = newDesired()
	m.sum = newSummaries()
	for _, fam := range nodeview.Families {
		m.shared[fam] = map[string]int{}
		t := nft.NewTable(tableFamily(fam), TableName)
		baseRules(t, fam, node) // declares the shared sets
		m.d.Tables[fam] = t
	}
}

// buildFragments builds the fragments of svcs. Fragments are independent,
// so at start-up, with every Service new, they are built on all CPUs.
func buildFragments(svcs []Change, node NodeFacts, picks *pickCache) []*fragment {
	out := make([]*fragment, len(svcs))
	parallel(len(svcs), func(i int) { out[i] = buildFragment(svcs[i].Svc, svcs[i].Slices, node, picks) })
	return out
}

// parallel calls fn for 0 to n-1, on all CPUs when n is big enough.
func parallel(n int, fn func(i int)) {
	workers := min(runtime.GOMAXPROCS(0), n/parallelFrom)
	if workers < 2 {
		for i := range n {
			fn(i)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				fn(i)
			}
		})
	}
	wg.Wait()
}

// parallelFrom is how many fragments make a build worth another goroutine.
var parallelFrom = 256

func buildFragment(svc *serviceRecord, eps []*sliceRecord, node NodeFacts, picks *pickCache) *fragment {
	d := newDesired()
	var tables [2]*fragTable // by the index of the family in nodeview.Families
	for i, fam := range nodeview.Families {
		// Only a family the Service has ClusterIPs of gets rules (build).
		if slices.ContainsFunc(svc.ports, func(sp servicePort) bool {
			return slices.ContainsFunc(sp.ClusterIPs, func(a netip.Addr) bool { return nodeview.FamilyOf(a) == fam })
		}) {
			tables[i] = newFragTable(fam)
		}
	}
	for i := range svc.ports {
		sp := &svc.ports[i]
		spEps := endpointsFor(sp, eps, node.Name)
		for _, t := range tables {
			if t != nil {
				b := &builder{t: t, d: d, node: node, sp: sp, picks: picks}
				b.build(familyEndpoints(spEps, t.fam))
			}
		}
	}
	f := &fragment{svc: svc, slices: eps, d: d}
	for _, t := range tables {
		if t == nil || len(t.Chains) == 0 && len(t.Sets) == 0 && len(t.shared) == 0 && len(t.elems) == 0 {
			continue
		}
		// An element added twice (a ClusterIP per port) is kept once.
		elems := t.elems
		slices.SortFunc(elems, func(a, b fragElem) int { return cmp.Or(strings.Compare(a.set, b.set), strings.Compare(a.id, b.id)) })
		f.parts = append(f.parts, fragPart{fam: t.fam, chains: slices.Collect(maps.Values(t.Chains)), shared: t.shared,
			sets: slices.Collect(maps.Values(t.Sets)), elems: slices.Compact(elems)})
	}
	d.Tables = nil
	if len(d.Health) == 0 && len(d.UDP) == 0 {
		d.Health, d.UDP = nil, nil // most Services: no empty maps kept
	}
	return f
}

// reserve grows the merged tables' maps once for what frags will add: at
// start-up every Service is new, and growing maps of 100,000 elements one
// insertion at a time is most of a full build's allocations.
func (m *Model) reserve(frags []*fragment) {
	for fam, t := range m.d.Tables {
		chains, elems := len(t.Chains), map[string]int{}
		for _, f := range frags {
			for _, part := range f.parts {
				if part.fam == fam {
					chains += len(part.chains)
					for _, e := range part.elems {
						elems[e.set]++
					}
				}
			}
		}
		t.Chains = grown(t.Chains, chains)
		for name, n := range elems { // shared sets only
			s := t.Set(name, sharedSets[fam][name])
			m := s.Mutable()
			s.Elements = grown(m, len(m)+n)
		}
	}
}

// grown is m in a map with room for n entries, or m when it has enough.
func grown[V any](m map[string]V, n int) map[string]V {
	if n <= 2*len(m) {
		return m
	}
	out := make(map[string]V, n)
	maps.Copy(out, m)
	return out
}

// add merges a fragment's chains and elements into the model's tables.
// Fragment chains and sets are shared read-only, never modified.
func (m *Model) add(f *fragment) {
	m.summaryAdd(f)
	for _, part := range f.parts {
		t := m.d.Tables[part.fam]
		m.touch(part)
		for _, c := range part.chains {
			t.Chains[c.Name] = c
		}
		for _, c := range part.shared {
			if m.shared[part.fam][c.Name]++; m.shared[part.fam][c.Name] == 1 {
				t.Chains[c.Name] = c
			}
		}
		for _, s := range part.sets {
			t.Sets[s.Name] = s
		}
		for _, e := range part.elems {
			t.Set(e.set, sharedSets[part.fam][e.set]).Mutable()[e.id]++
		}
	}
}

// touch records a fragment's chains, own sets and shared elements as
// changed (when changes are being recorded: not before the first take).
func (m *Model) touch(part fragPart) {
	t := m.touched[part.fam]
	if t == nil {
		return
	}
	for _, c := range part.chains {
		t.Chains[c.Name] = true
	}
	for _, c := range part.shared {
		t.Chains[c.Name] = true // unchanged while in use: the programmer finds nothing to do
	}
	for _, s := range part.sets {
		t.Sets[s.Name] = true
	}
	for _, e := range part.elems {
		t.Elem(e.set, e.id)
	}
}

// removeAll takes fragments out of the model's tables. Their shared
// elements are built again first, on all CPUs when many go at once (a
// relist gives every record a new pointer).
func (m *Model) removeAll(frags []*fragment) {
	elems := make([]map[nodeview.Family][]fragElem, len(frags))
	parallel(len(frags), func(i int) { elems[i] = m.sharedElems(frags[i]) })
	for i, f := range frags {
		m.remove(f, elems[i])
	}
}

// remove takes a fragment's chains and its shared elements out of the
// model's tables.
func (m *Model) remove(f *fragment, elems map[nodeview.Family][]fragElem) {
	m.summaryRemove(f)
	for _, part := range f.parts {
		part.elems = elems[part.fam]
		t := m.d.Tables[part.fam]
		m.touch(part)
		for _, c := range part.chains {
			delete(t.Chains, c.Name)
		}
		for _, c := range part.shared {
			if m.shared[part.fam][c.Name]--; m.shared[part.fam][c.Name] == 0 {
				delete(m.shared[part.fam], c.Name)
				delete(t.Chains, c.Name)
			}
		}
		for _, s := range part.sets {
			delete(t.Sets, s.Name)
		}
		for _, e := range part.elems {
			s := t.Sets[e.set]
			if s == nil {
				continue // nothing of it left to remove (cannot happen: records rebuild the same elements)
			}
			merged := s.Mutable()
			if merged[e.id]--; merged[e.id] == 0 {
				delete(merged, e.id)
			}
			if len(merged) == 0 && onDemand[e.set] {
				delete(t.Sets, e.set)
			}
		}
	}
}

// sharedElems are the elements a merged fragment added to shared sets,
// built again from its records: the same records and node facts give the
// same elements, and a change of the node's facts resets the model.
func (m *Model) sharedElems(f *fragment) map[nodeview.Family][]fragElem {
	out := map[nodeview.Family][]fragElem{}
	for _, part := range buildFragment(f.svc, f.slices, m.node, m.picks).parts {
		out[part.fam] = part.elems
	}
	return out
}
