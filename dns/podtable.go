package dns

import (
	"encoding/binary"
	"maps"
	"net/netip"
	"slices"
)

// podTable maps addresses to the namespaces of the pods holding them, for
// autopath and verified pod records. Its big maps hold no pointers (an
// address to a namespace's number), so the garbage collector never scans
// them, however many pods the cluster runs. An IPv4 address and its
// namespace take 8 bytes of a sorted array: at 150,000 pods a Go map
// took 42 bytes a pod with 16-byte keys for all, 21 with 4-byte ones
// (BenchmarkAutopathMemory). The few addresses several pods hold
// (host-network pods share their node's) are listed apart with every
// holder.
type podTable struct {
	first4 *sortedMap[uint32, uint32]  // the namespace of the address's first pod
	first6 *cowMap[[16]byte, uint32]   // the same for IPv6 addresses
	shared *cowMap[[16]byte, []uint32] // addresses of several pods: each pod's namespace, in arrival order
	names  []string                    // namespace number → name; replaced by a longer copy, never changed
	ids    map[string]uint32           // name → number; replaced with names
}

func newPodTable() podTable {
	return podTable{first4: &sortedMap[uint32, uint32]{}, first6: &cowMap[[16]byte, uint32]{}, shared: &cowMap[[16]byte, []uint32]{}, ids: map[string]uint32{}}
}

// firstOf is the namespace number of the first pod holding a.
func firstOf(first4 *sortedMap[uint32, uint32], first6 *cowMap[[16]byte, uint32], a netip.Addr) (uint32, bool) {
	if a.Is4() {
		return first4.get(v4Key(a))
	}
	return first6.get(a.As16())
}

func v4Key(a netip.Addr) uint32 {
	b := a.As4()
	return binary.BigEndian.Uint32(b[:])
}

// namespace is the namespace of the first pod holding a.
func (t *podTable) namespace(a netip.Addr) (string, bool) {
	id, ok := firstOf(t.first4, t.first6, a.Unmap())
	if !ok {
		return "", false
	}
	return t.names[id], true
}

// holds reports whether a pod of namespace ns holds a.
func (t *podTable) holds(a netip.Addr, ns string) bool {
	id, known := t.ids[ns]
	if !known {
		return false
	}
	a = a.Unmap()
	if ids, ok := t.shared.get(a.As16()); ok {
		return slices.Contains(ids, id)
	}
	first, ok := firstOf(t.first4, t.first6, a)
	return ok && first == id
}

// podTableEditor derives the next podTable, copying only what it changes.
type podTableEditor struct {
	first4 *sortedEditor[uint32, uint32]
	first6 *cowEditor[[16]byte, uint32]
	shared *cowEditor[[16]byte, []uint32]
	names  []string
	ids    map[string]uint32
	grown  bool // names and ids are this editor's own copies
}

func (t *podTable) edit() *podTableEditor {
	return &podTableEditor{first4: editSorted(t.first4), first6: edit(t.first6), shared: edit(t.shared), names: t.names, ids: t.ids}
}

func (e *podTableEditor) done() podTable {
	return podTable{first4: e.first4.result(), first6: e.first6.m, shared: e.shared.m, names: e.names, ids: e.ids}
}

func (e *podTableEditor) first(a netip.Addr) (uint32, bool) {
	return firstOf(e.first4.result(), e.first6.m, a)
}

func (e *podTableEditor) setFirst(a netip.Addr, id uint32) {
	if a.Is4() {
		e.first4.set(v4Key(a), id)
	} else {
		e.first6.set(a.As16(), id)
	}
}

func (e *podTableEditor) delFirst(a netip.Addr) {
	if a.Is4() {
		e.first4.del(v4Key(a))
	} else {
		e.first6.del(a.As16())
	}
}

// id numbers a namespace, the first time by copying the numbering: older
// tables are being read.
func (e *podTableEditor) id(ns string) uint32 {
	if id, ok := e.ids[ns]; ok {
		return id
	}
	if !e.grown {
		e.names, e.ids, e.grown = slices.Clone(e.names), maps.Clone(e.ids), true
	}
	id := uint32(len(e.names))
	e.names = append(e.names, ns)
	e.ids[ns] = id
	return id
}

// add records one more pod of namespace ns holding a.
func (e *podTableEditor) add(a netip.Addr, ns string) {
	a = a.Unmap()
	k, id := a.As16(), e.id(ns)
	if ids, ok := e.shared.get(k); ok {
		e.shared.set(k, append(slices.Clone(ids), id))
	} else if first, ok := e.first(a); ok {
		e.shared.set(k, []uint32{first, id})
	} else {
		e.setFirst(a, id)
	}
}

// remove records that one pod of namespace ns no longer holds a.
func (e *podTableEditor) remove(a netip.Addr, ns string) {
	id, known := e.ids[ns]
	if !known {
		return
	}
	a = a.Unmap()
	k := a.As16()
	ids, ok := e.shared.get(k)
	if !ok {
		if first, ok := e.first(a); ok && first == id {
			e.delFirst(a)
		}
		return
	}
	i := slices.Index(ids, id)
	if i < 0 {
		return
	}
	ids = slices.Delete(slices.Clone(ids), i, i+1)
	if len(ids) == 1 {
		e.shared.del(k)
	} else {
		e.shared.set(k, ids)
	}
	e.setFirst(a, ids[0])
}
