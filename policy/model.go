package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"net/netip"
	"slices"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/netplane/netplane/nodeview"
)

// Direction is ingress or egress.
type Direction uint8

const (
	Ingress Direction = iota
	Egress
)

var directions = [2]Direction{Ingress, Egress}

func (d Direction) String() string {
	if d == Egress {
		return "egress"
	}
	return "ingress"
}

// Config is what the model needs of its node.
type Config struct {
	Node     string            // pods of this node are enforced
	Families []nodeview.Family // nil: both
	Priority int               // of the forward and input base chains
	// Log, when set, logs denied packets (NFLOG, rate-limited) before
	// they are counted and dropped.
	Log Log
}

// Model keeps the desired table up to date as pods, namespaces and
// policies come, change and go, at a cost in proportion to the change:
// a pod is matched against the selectors of its namespace only, a new
// selector against the pods of the namespaces it can select, a namespace's
// new labels move its pods in or out of the namespace selectors that
// changed their mind. It records what it touched for a partial sync. Not
// safe for concurrent use.
type Model struct {
	cfg      Config
	fams     []nodeview.Family
	t        *Table
	touched  *Touched
	ns       map[string]*nsState
	policies map[types.NamespacedName]*policyState
	sels     map[string]*selector // peer selectors by PeerSelector.Key
	global   map[*selector]struct{}
	blocks   map[string]*block // ipBlocks by Block.Key
	groups   map[string]*group // group chains by name
	// claims are the local enforced pods by address, first one first: two
	// pods may briefly hold one address, and a map has one element per key.
	claims map[netip.Addr][]*podState
	addrs  addrIndex                // the addresses of every active pod
	vmap   [2]map[netip.Addr]string // the verdict maps' elements: address → group chain
	cl     *clusterState            // ClusterNetworkPolicies and Nodes; nil until the first
}

type nsState struct {
	name     string
	labels   map[string]string
	known    bool                   // a Namespace record was given
	pods     map[string]*podState   // by name
	local    map[*podState]struct{} // the pods enforced here
	sels     map[*selector]struct{} // the selectors that can select its pods
	policies map[*policyState]struct{}
}

// podState is a pod in the model. Most pods are only peers here: what an
// enforced pod needs besides is apart, so a peer costs three words.
type podState struct {
	rec *Pod
	ns  *nsState
	enf *enforced // nil unless enforced on this node
}

// enforced are the chains of a pod enforced on this node.
type enforced struct {
	groups [2]*group    // nil: not isolated in that direction
	tiers  [2][2]*group // by Direction, Tier: its Admin and Baseline chains, if any
	entry  [2]string    // the chain its verdict map elements jump to; "" for none
	next   [2]string    // the chain its next map elements jump to (cnp_tiers.go)
}

func (p *podState) labels() labels.Set { return labels.Set(p.rec.Labels) }

// Touched names what changed since the last TakeTouched: chains and sets
// made or removed, and elements added to or removed from sets that stayed.
// A partial sync compares only these with the kernel.
type Touched struct {
	Chains map[string]bool
	Sets   map[string]bool
	Elems  map[string]map[Element]bool
}

func newTouched() *Touched {
	return &Touched{Chains: map[string]bool{}, Sets: map[string]bool{}, Elems: map[string]map[Element]bool{}}
}

// NewModel returns a model with no objects: its table holds the base
// chains, the deny chains, the verdict maps and the counters.
func NewModel(cfg Config) *Model {
	m := &Model{
		cfg:      cfg,
		fams:     cfg.Families,
		t:        &Table{Chains: map[string]*Chain{}, Sets: map[string]*Set{}},
		ns:       map[string]*nsState{},
		policies: map[types.NamespacedName]*policyState{},
		sels:     map[string]*selector{},
		global:   map[*selector]struct{}{},
		blocks:   map[string]*block{},
		groups:   map[string]*group{},
		claims:   map[netip.Addr][]*podState{},
		addrs:    newAddrIndex(),
		vmap:     [2]map[netip.Addr]string{{}, {}},
	}
	if m.fams == nil {
		m.fams = nodeview.Families
	}
	m.baseChains()
	return m
}

// Table is the desired table. It belongs to the model and changes in place
// with the next call that changes the model.
func (m *Model) Table() *Table { return m.t }

// TakeTouched returns what changed since the last call and forgets it;
// nil the first time (all of the table is new).
func (m *Model) TakeTouched() *Touched {
	t := m.touched
	m.touched = newTouched()
	return t
}

// Counts are the policies in the model and the local pods isolated in at
// least one direction: what the tables enforce.
func (m *Model) Counts() (policies, isolated int) {
	for _, st := range m.ns {
		for p := range st.local {
			if p.enf.entry[Ingress] != "" || p.enf.entry[Egress] != "" {
				isolated++
			}
		}
	}
	return len(m.policies), isolated
}

// LocalPod is the pod of this node whose rules the address's packets meet,
// if any: the one a denied packet's log line names.
func (m *Model) LocalPod(a netip.Addr) (types.NamespacedName, bool) {
	if c := m.claims[a.Unmap()]; len(c) > 0 {
		return c[0].rec.Key(), true
	}
	return types.NamespacedName{}, false
}

// UpsertNamespace adds or changes a namespace.
func (m *Model) UpsertNamespace(rec *Namespace) {
	st := m.namespace(rec.Name)
	if st.known && maps.Equal(st.labels, rec.Labels) {
		return
	}
	st.labels, st.known = rec.Labels, true
	m.relabel(st)
	m.relabelSubjects(st)
}

// DeleteNamespace forgets a namespace's labels; its pods and policies go
// with their own deletions.
func (m *Model) DeleteNamespace(name string) {
	st := m.ns[name]
	if st == nil {
		return
	}
	st.labels, st.known = nil, false
	m.relabel(st)
	m.relabelSubjects(st)
	m.forgetNamespace(st)
}

// relabel moves the namespace's pods in or out of the namespace selectors
// whose answer changed with its labels.
func (m *Model) relabel(st *nsState) {
	set := labelsOf(st)
	for s := range m.global {
		_, was := st.sels[s]
		now := s.ps.Namespaces.Matches(set)
		if was == now {
			continue
		}
		if now {
			st.sels[s] = struct{}{}
			m.fill(s, st)
			continue
		}
		delete(st.sels, s)
		for _, p := range st.pods {
			if s.has(p) {
				m.leave(s, p, p.rec)
			}
		}
	}
}

// UpsertPod adds or changes a pod.
func (m *Model) UpsertPod(rec *Pod) {
	st := m.namespace(rec.Namespace)
	p := st.pods[rec.Name]
	if p == nil {
		p = &podState{ns: st}
		st.pods[rec.Name] = p
	}
	m.setPod(p, rec)
}

// DeletePod removes a pod.
func (m *Model) DeletePod(key types.NamespacedName) {
	p := m.pod(key)
	if p == nil {
		return
	}
	m.setPod(p, &Pod{Namespace: key.Namespace, Name: key.Name}) // matches nothing, enforced nowhere
	delete(p.ns.pods, key.Name)
	m.forgetNamespace(p.ns)
}

// pod is the state of the pod of that key; nil if there is none.
func (m *Model) pod(key types.NamespacedName) *podState {
	if st := m.ns[key.Namespace]; st != nil {
		return st.pods[key.Name]
	}
	return nil
}

func (m *Model) setPod(p *podState, rec *Pod) {
	old := p.rec
	// Most updates change labels or status, not what the index keeps.
	reindex := old == nil || old.active() != rec.active() || !slices.Equal(old.IPs, rec.IPs)
	if reindex {
		m.addrs.remove(old, p)
	}
	p.rec = rec
	if reindex {
		m.addrs.add(rec, p)
	}
	m.rematch(p, old)
	wasLocal := p.enf != nil
	local := rec.Node == m.cfg.Node && rec.active()
	if local {
		p.ns.local[p] = struct{}{}
		if p.enf == nil {
			p.enf = &enforced{}
		}
	} else {
		delete(p.ns.local, p)
	}
	var addrs []netip.Addr
	if wasLocal {
		addrs = m.unclaim(p, old.IPs)
	}
	if local {
		addrs = append(addrs, m.claim(p, rec.IPs)...)
	}
	m.regroup(p) // releases the chains of a pod no longer enforced here
	if !local {
		p.enf = nil
	}
	for _, a := range addrs {
		m.syncAddr(a)
	}
}

// namespace is the state of a namespace, made on first mention (a pod or
// policy may come before its namespace).
func (m *Model) namespace(name string) *nsState {
	st := m.ns[name]
	if st == nil {
		st = &nsState{name: name, pods: map[string]*podState{}, local: map[*podState]struct{}{},
			sels: map[*selector]struct{}{}, policies: map[*policyState]struct{}{}}
		m.ns[name] = st
		for s := range m.global {
			if s.ps.Namespaces.Matches(labelsOf(st)) {
				st.sels[s] = struct{}{}
			}
		}
	}
	return st
}

// forgetNamespace drops the state of a namespace nothing refers to.
func (m *Model) forgetNamespace(st *nsState) {
	if st.known || len(st.pods) > 0 || len(st.policies) > 0 {
		return
	}
	for s := range st.sels {
		if s.ps.Namespaces == nil {
			return // a policy elsewhere still selects pods here by name
		}
	}
	delete(m.ns, st.name)
}

// hashOf names content in a few characters: 64 bits of its SHA-256.
func hashOf(content string) string {
	sum := sha256.Sum256([]byte(content))
	return hex.EncodeToString(sum[:8])
}

func labelsOf(st *nsState) labels.Set { return labels.Set(st.labels) }

// Table changes, recorded in touched.

func (m *Model) putChain(c *Chain) {
	m.t.Chains[c.Name] = c
	if m.touched != nil {
		m.touched.Chains[c.Name] = true
	}
}

func (m *Model) dropChain(name string) {
	delete(m.t.Chains, name)
	if m.touched != nil {
		m.touched.Chains[name] = true
	}
}

func (m *Model) putSet(s *Set) {
	m.t.Sets[s.Name] = s
	if m.touched != nil {
		m.touched.Sets[s.Name] = true
	}
}

func (m *Model) dropSet(name string) {
	delete(m.t.Sets, name)
	if m.touched != nil {
		m.touched.Sets[name] = true
		delete(m.touched.Elems, name)
	}
}

func (m *Model) addElem(set string, e Element) {
	s := m.t.Sets[set]
	if s.elems[e]++; s.elems[e] == 1 {
		m.touchElem(set, e)
	}
}

func (m *Model) delElem(set string, e Element) {
	s := m.t.Sets[set]
	if s.elems[e]--; s.elems[e] <= 0 {
		delete(s.elems, e)
		m.touchElem(set, e)
	}
}

func (m *Model) touchElem(set string, e Element) {
	if m.touched == nil || m.touched.Sets[set] {
		return // the whole set is new or gone
	}
	es := m.touched.Elems[set]
	if es == nil {
		es = map[Element]bool{}
		m.touched.Elems[set] = es
	}
	es[e] = true
}
