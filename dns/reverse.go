package dns

import (
	"net/netip"
	"slices"
)

// ptrIndex maps an address to the Services that name it in reverse lookups
// (the names are made per query from the Services' records). Nearly every
// address has one such Service: it is kept in the address's slot, and only
// the others apart. An IPv4 address's slot is 16 bytes of a sorted array,
// the address and a pointer to the Service's key, which every address the
// Service gained in one change shares. A Go map of netip.Addr to svcKey
// took 8.7 MB for 72,250 addresses where this takes 1.9, keys included,
// and was 10.9 MB of a 32 MB live heap in a profile of 150,000 pods
// (docs/benchmarks.md).
type ptrIndex struct {
	first4 *sortedMap[uint32, *svcKey]
	first6 *cowMap[netip.Addr, *svcKey]  // IPv6 and IPv4-mapped addresses
	more   *cowMap[netip.Addr, []svcKey] // the second and later, in the order they came
}

func newPtrIndex() ptrIndex {
	return ptrIndex{&sortedMap[uint32, *svcKey]{}, &cowMap[netip.Addr, *svcKey]{}, &cowMap[netip.Addr, []svcKey]{}}
}

func (p ptrIndex) first(a netip.Addr) (*svcKey, bool) {
	if a.Is4() {
		return p.first4.get(v4Key(a))
	}
	return p.first6.get(a)
}

// namers are the Services naming a, in the order they came.
func (p ptrIndex) namers(a netip.Addr) []svcKey {
	f, ok := p.first(a)
	if !ok {
		return nil
	}
	more, _ := p.more.get(a)
	return append([]svcKey{*f}, more...)
}

// ptrEditor derives the next ptrIndex; lists are never changed in place,
// older indexes are being read.
type ptrEditor struct {
	first4 *sortedEditor[uint32, *svcKey]
	first6 *cowEditor[netip.Addr, *svcKey]
	more   *cowEditor[netip.Addr, []svcKey]
}

func (p ptrIndex) edit() ptrEditor {
	return ptrEditor{editSorted(p.first4), edit(p.first6), edit(p.more)}
}

func (e ptrEditor) done() ptrIndex { return ptrIndex{e.first4.result(), e.first6.m, e.more.m} }

func (e ptrEditor) first(a netip.Addr) (*svcKey, bool) { return e.done().first(a) }

func (e ptrEditor) setFirst(a netip.Addr, k *svcKey) {
	if a.Is4() {
		e.first4.set(v4Key(a), k)
	} else {
		e.first6.set(a, k)
	}
}

func (e ptrEditor) delFirst(a netip.Addr) {
	if a.Is4() {
		e.first4.del(v4Key(a))
	} else {
		e.first6.del(a)
	}
}

// add records that k names a; k is shared, never changed.
func (e ptrEditor) add(a netip.Addr, k *svcKey) {
	if _, ok := e.first(a); !ok {
		e.setFirst(a, k)
		return
	}
	more, _ := e.more.get(a)
	e.more.set(a, append(slices.Clip(more), *k))
}

func (e ptrEditor) remove(a netip.Addr, k svcKey) {
	f, ok := e.first(a)
	if !ok {
		return
	}
	more, _ := e.more.get(a)
	switch {
	case *f == k && len(more) == 0:
		e.delFirst(a)
		return
	case *f == k:
		next := more[0]
		e.setFirst(a, &next)
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
