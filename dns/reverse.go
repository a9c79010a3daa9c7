package dns

import (
	"net/netip"
	"slices"
)

// ptrIndex maps an address to the Services that name it in reverse lookups
// (the names are made per query from the Services' records). Nearly every
// address has one such Service: it is kept in the map's slot, and only the
// others apart, so an address costs no allocation of its own. A list per
// address was 32 bytes more each: 2.3 MB at 72,500 addresses.
type ptrIndex struct {
	first *cowMap[netip.Addr, svcKey]
	more  *cowMap[netip.Addr, []svcKey] // the second and later, in the order they came
}

func newPtrIndex() ptrIndex {
	return ptrIndex{first: &cowMap[netip.Addr, svcKey]{}, more: &cowMap[netip.Addr, []svcKey]{}}
}

// namers are the Services naming a, in the order they came.
func (p ptrIndex) namers(a netip.Addr) []svcKey {
	f, ok := p.first.get(a)
	if !ok {
		return nil
	}
	more, _ := p.more.get(a)
	return append([]svcKey{f}, more...)
}

// ptrEditor derives the next ptrIndex; lists are never changed in place,
// older indexes are being read.
type ptrEditor struct {
	first *cowEditor[netip.Addr, svcKey]
	more  *cowEditor[netip.Addr, []svcKey]
}

func (p ptrIndex) edit() ptrEditor { return ptrEditor{edit(p.first), edit(p.more)} }

func (e ptrEditor) done() ptrIndex { return ptrIndex{e.first.m, e.more.m} }

func (e ptrEditor) add(a netip.Addr, k svcKey) {
	if _, ok := e.first.get(a); !ok {
		e.first.set(a, k)
		return
	}
	more, _ := e.more.get(a)
	e.more.set(a, append(slices.Clip(more), k))
}

func (e ptrEditor) remove(a netip.Addr, k svcKey) {
	f, ok := e.first.get(a)
	if !ok {
		return
	}
	more, _ := e.more.get(a)
	switch {
	case f == k && len(more) == 0:
		e.first.del(a)
		return
	case f == k:
		e.first.set(a, more[0])
		more = more[1:]
	default:
		more = slices.DeleteFunc(slices.Clone(more), func(o svcKey) bool { return o == k })
	}
	if len(more) == 0 {
		e.more.del(a)
	} else {
		e.more.set(a, more)
	}
}
