package policy

import (
	"net/netip"
	"slices"

	"github.com/netplane/netplane/nodeview"
)

// This file derives the elements of a peer selector's sets from its
// members instead of storing them: a pod's address is held once, in its
// record, however many selectors it is a member of; what a selector adds
// per member pod is one entry of its member map. An index of the
// addresses of the pods that can be peers answers "is this element in the
// set" without a scan. The sets are rendered from the members when
// written, and a pod's joining or leaving touches the elements it gives.

// addrKey is an address as a compact, pointer-free map key. Pod addresses
// are unmapped (PodFromAPI), so no IPv4 address meets its IPv6 twin.
type addrKey [16]byte

func keyOf(a netip.Addr) addrKey { return a.As16() }

// addrIndex finds the active pods holding an address: one pod, almost
// always; a shared address's further holders are in more.
type addrIndex struct {
	one  map[addrKey]*podState
	more map[addrKey][]*podState
}

func newAddrIndex() addrIndex {
	return addrIndex{one: map[addrKey]*podState{}, more: map[addrKey][]*podState{}}
}

func (x *addrIndex) add(rec *Pod, p *podState) {
	if !rec.active() {
		return
	}
	for _, a := range rec.IPs {
		k := keyOf(a)
		if _, ok := x.one[k]; !ok {
			x.one[k] = p
			continue
		}
		x.more[k] = append(x.more[k], p)
	}
}

func (x *addrIndex) remove(rec *Pod, p *podState) {
	if rec == nil || !rec.active() {
		return
	}
	for _, a := range rec.IPs {
		k := keyOf(a)
		if more := slices.DeleteFunc(x.more[k], func(q *podState) bool { return q == p }); len(more) < len(x.more[k]) {
			x.setMore(k, more)
			continue
		}
		if x.one[k] != p {
			continue
		}
		if more := x.more[k]; len(more) > 0 {
			x.one[k] = more[0]
			x.setMore(k, more[1:])
			continue
		}
		delete(x.one, k)
	}
}

func (x *addrIndex) setMore(k addrKey, more []*podState) {
	if len(more) == 0 {
		delete(x.more, k)
		return
	}
	x.more[k] = more
}

// first is the first holder of a, in the index's order, for which ok
// holds; nil if none.
func (x *addrIndex) first(a netip.Addr, ok func(*podState) bool) *podState {
	k := keyOf(a)
	p := x.one[k]
	if p == nil {
		return nil
	}
	if ok(p) {
		return p
	}
	for _, q := range x.more[k] {
		if ok(q) {
			return q
		}
	}
	return nil
}

// derived are the elements of a set made from a selector's members.
type derived interface {
	has(Element) bool
	// each yields every element once, in no order.
	each(yield func(Element) bool)
	// size is about the number of elements: room to make for them.
	size() int
}

// selElems are the addresses of family f of a selector's members.
type selElems struct {
	x *addrIndex
	s *selector
	f nodeview.Family
}

func (v selElems) holds(a netip.Addr) func(*podState) bool {
	return func(p *podState) bool { return v.s.has(p) && slices.Contains(p.rec.IPs, a) }
}

func (v selElems) has(e Element) bool {
	return e == Element{Addr: e.Addr} && nodeview.FamilyOf(e.Addr) == v.f && v.x.first(e.Addr, v.holds(e.Addr)) != nil
}

func (v selElems) size() int { return len(v.s.members) }

func (v selElems) each(yield func(Element) bool) {
	for p := range v.s.members {
		for _, a := range p.rec.IPs {
			// A shared address is the element of its first holder only
			// (most have one holder: found without a closure per element).
			if nodeview.FamilyOf(a) == v.f && (v.x.one[keyOf(a)] == p || v.x.first(a, v.holds(a)) == p) && !yield(Element{Addr: a}) {
				return
			}
		}
	}
}

// portElems are address . protocol . port of the named port of a named
// set on the members of its selector, of family f.
type portElems struct {
	x *addrIndex
	n *namedSet
	f nodeview.Family
}

func (v portElems) holds(e Element) func(*podState) bool {
	return func(p *podState) bool {
		return v.n.sel.has(p) && slices.Contains(p.rec.IPs, e.Addr) && slices.Contains(p.rec.Ports, NamedPort{Name: v.n.port, Protocol: e.Proto, Port: e.Port})
	}
}

func (v portElems) has(e Element) bool {
	return e.End == (netip.Addr{}) && e.Chain == "" && nodeview.FamilyOf(e.Addr) == v.f && v.x.first(e.Addr, v.holds(e)) != nil
}

func (v portElems) size() int { return len(v.n.sel.members) }

func (v portElems) each(yield func(Element) bool) {
	for p := range v.n.sel.members {
		for i, port := range p.rec.Ports {
			// A port listed twice (a container and a sidecar) is one element.
			if port.Name != v.n.port || slices.Contains(p.rec.Ports[:i], port) {
				continue
			}
			for _, a := range p.rec.IPs {
				e := Element{Addr: a, Proto: port.Protocol, Port: port.Port}
				if nodeview.FamilyOf(a) == v.f && (v.x.one[keyOf(a)] == p || v.x.first(a, v.holds(e)) == p) && !yield(e) {
					return
				}
			}
		}
	}
}

func (s *selector) has(p *podState) bool {
	_, ok := s.members[p]
	return ok
}
