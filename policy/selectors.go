package policy

import (
	"net/netip"
	"slices"

	"github.com/netplane/netplane/nodeview"
)

// This file keeps the address sets of peers: one set per family for each
// distinct peer selector (sel-…), shared by every policy naming it; one
// per named port of a selector for egress (nport-…, address . protocol .
// port); one interval set per distinct ipBlock (cidr-…). Selectors know
// their member pods, whose records make the elements of their sets
// (members.go); a pod's memberships are those of the selectors of its
// namespace that hold it, so a pod's change touches only the elements of
// the sets it enters or leaves.

// selector is a peer selector in use, with its members.
type selector struct {
	ps      *PeerSelector
	hash    string
	members map[*podState]struct{}
	named   map[string]*namedSet // by port name
	refs    int
}

// namedSet is the set of (address, protocol, port) of a named port on the
// members of a selector: egress rules naming a port match it.
type namedSet struct {
	sel  *selector
	port string
	hash string
	refs int
}

// block is an ipBlock in use: its interval set never changes.
type block struct {
	b    *Block
	name string
	refs int
}

func setName(kind string, f nodeview.Family, hash string) string {
	return kind + suffix(f) + "-" + hash
}

func (m *Model) acquireSel(ps *PeerSelector) *selector {
	if s := m.sels[ps.Key]; s != nil {
		s.refs++
		return s
	}
	hash := hashOf(ps.Key)
	s := &selector{ps: ps, hash: hash, members: map[*podState]struct{}{}, named: map[string]*namedSet{}, refs: 1}
	m.sels[ps.Key] = s
	for _, f := range m.fams {
		m.putSet(derivedSet(setName("sel", f, hash), f, AddrSet, selElems{&m.addrs, s, f}))
	}
	if ps.Namespaces == nil {
		st := m.namespace(ps.Namespace)
		st.sels[s] = struct{}{}
		m.fill(s, st)
		return s
	}
	m.global[s] = struct{}{}
	for _, st := range m.ns {
		if ps.Namespaces.Matches(labelsOf(st)) {
			st.sels[s] = struct{}{}
			m.fill(s, st)
		}
	}
	return s
}

func (m *Model) releaseSel(s *selector) {
	if s.refs--; s.refs > 0 {
		return
	}
	delete(m.sels, s.ps.Key)
	delete(m.global, s)
	for _, f := range m.fams {
		m.dropSet(setName("sel", f, s.hash))
	}
	if s.ps.Namespaces == nil {
		if st := m.ns[s.ps.Namespace]; st != nil {
			delete(st.sels, s)
			m.forgetNamespace(st)
		}
		return
	}
	for _, st := range m.ns {
		delete(st.sels, s)
	}
}

// fill adds the matching pods of a namespace to a selector.
func (m *Model) fill(s *selector, st *nsState) {
	for _, p := range st.pods {
		if p.rec.active() && s.ps.Pods.Matches(p.labels()) {
			m.join(s, p, p.rec)
		}
	}
}

// rematch brings the pod's selector memberships and their elements from
// what old (nil for a new pod) gave to what p.rec gives.
func (m *Model) rematch(p *podState, old *Pod) {
	var now []*selector
	if p.rec.active() {
		for s := range p.ns.sels {
			if s.ps.Pods.Matches(p.labels()) {
				now = append(now, s)
			}
		}
	}
	moved := old != nil && (!slices.Equal(old.IPs, p.rec.IPs) || !slices.Equal(old.Ports, p.rec.Ports))
	for s := range p.ns.sels {
		if !s.has(p) {
			continue
		}
		switch {
		case !slices.Contains(now, s):
			m.leave(s, p, old)
		case moved:
			m.leave(s, p, old)
			m.join(s, p, p.rec)
		}
	}
	for _, s := range now {
		if !s.has(p) {
			m.join(s, p, p.rec)
		}
	}
}

// join makes p a member of s with the addresses and ports of rec.
func (m *Model) join(s *selector, p *podState, rec *Pod) {
	s.members[p] = struct{}{}
	m.touchPod(s, rec)
}

// leave takes p out of s; rec is its record when it joined.
func (m *Model) leave(s *selector, p *podState, rec *Pod) {
	delete(s.members, p)
	m.touchPod(s, rec)
}

// touchPod records the elements rec gives the sets of s as touched: they
// may have come or gone.
func (m *Model) touchPod(s *selector, rec *Pod) {
	if m.touched == nil {
		return
	}
	for _, a := range rec.IPs {
		if m.family(a) {
			m.touchElem(setName("sel", nodeview.FamilyOf(a), s.hash), Element{Addr: a})
		}
	}
	for _, n := range s.named {
		for _, port := range rec.Ports {
			if port.Name != n.port {
				continue
			}
			for _, a := range rec.IPs {
				if m.family(a) {
					m.touchElem(setName("nport", nodeview.FamilyOf(a), n.hash), Element{Addr: a, Proto: port.Protocol, Port: port.Port})
				}
			}
		}
	}
}

// family: rules and sets are made for a's family.
func (m *Model) family(a netip.Addr) bool { return slices.Contains(m.fams, nodeview.FamilyOf(a)) }

func (m *Model) acquireNamed(s *selector, port string) *namedSet {
	if n := s.named[port]; n != nil {
		n.refs++
		return n
	}
	s.refs++ // the named set holds its selector
	n := &namedSet{sel: s, port: port, hash: hashOf(s.ps.Key + "|" + port), refs: 1}
	s.named[port] = n
	for _, f := range m.fams {
		m.putSet(derivedSet(setName("nport", f, n.hash), f, AddrProtoPortSet, portElems{&m.addrs, n, f}))
	}
	return n
}

func (m *Model) releaseNamed(n *namedSet) {
	if n.refs--; n.refs > 0 {
		return
	}
	delete(n.sel.named, n.port)
	for _, f := range m.fams {
		m.dropSet(setName("nport", f, n.hash))
	}
	m.releaseSel(n.sel)
}

func (m *Model) acquireBlock(b *Block) *block {
	if bl := m.blocks[b.Key]; bl != nil {
		bl.refs++
		return bl
	}
	bl := &block{b: b, name: setName("cidr", b.Family, hashOf(b.Key)), refs: 1}
	m.blocks[b.Key] = bl
	s := newSet(bl.name, b.Family, RangeSet)
	for _, r := range b.Ranges {
		s.elems[Element{Addr: r.From(), End: r.To()}] = 1
	}
	m.putSet(s)
	return bl
}

func (m *Model) releaseBlock(bl *block) {
	if bl.refs--; bl.refs > 0 {
		return
	}
	delete(m.blocks, bl.b.Key)
	m.dropSet(bl.name)
}
