package dns

import (
	"maps"
	"net/netip"
	"slices"
)

// podTable maps addresses to the namespaces of the pods holding them, for
// autopath and verified pod records. Its big map holds no pointers (an
// address's 16 bytes to a namespace's number), so the garbage collector
// never scans it, however many pods the cluster runs; the few addresses
// several pods hold (host-network pods share their node's) are listed
// apart with every holder.
type podTable struct {
	first  *cowMap[[16]byte, uint32]   // the namespace of the address's first pod
	shared *cowMap[[16]byte, []uint32] // addresses of several pods: each pod's namespace, in arrival order
	names  []string                    // namespace number → name; replaced by a longer copy, never changed
	ids    map[string]uint32           // name → number; replaced with names
}

func newPodTable() podTable {
	return podTable{first: &cowMap[[16]byte, uint32]{}, shared: &cowMap[[16]byte, []uint32]{}, ids: map[string]uint32{}}
}

// namespace is the namespace of the first pod holding a.
func (t *podTable) namespace(a netip.Addr) (string, bool) {
	id, ok := t.first.get(a.Unmap().As16())
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
	k := a.Unmap().As16()
	if ids, ok := t.shared.get(k); ok {
		return slices.Contains(ids, id)
	}
	first, ok := t.first.get(k)
	return ok && first == id
}

// podTableEditor derives the next podTable, copying only what it changes.
type podTableEditor struct {
	first  *cowEditor[[16]byte, uint32]
	shared *cowEditor[[16]byte, []uint32]
	names  []string
	ids    map[string]uint32
	grown  bool // names and ids are this editor's own copies
}

func (t *podTable) edit() *podTableEditor {
	return &podTableEditor{first: edit(t.first), shared: edit(t.shared), names: t.names, ids: t.ids}
}

func (e *podTableEditor) done() podTable {
	return podTable{first: e.first.m, shared: e.shared.m, names: e.names, ids: e.ids}
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
	k, id := a.Unmap().As16(), e.id(ns)
	if ids, ok := e.shared.get(k); ok {
		e.shared.set(k, append(slices.Clone(ids), id))
	} else if first, ok := e.first.get(k); ok {
		e.shared.set(k, []uint32{first, id})
	} else {
		e.first.set(k, id)
	}
}

// remove records that one pod of namespace ns no longer holds a.
func (e *podTableEditor) remove(a netip.Addr, ns string) {
	id, known := e.ids[ns]
	if !known {
		return
	}
	k := a.Unmap().As16()
	ids, ok := e.shared.get(k)
	if !ok {
		if first, ok := e.first.get(k); ok && first == id {
			e.first.del(k)
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
	e.first.set(k, ids[0])
}
