package dns

// podStore is the pods' view's record of every pod holding an address, by
// podKey: its namespace, its addresses, and the list that last named it.
// Neither key nor entry holds a pointer, so the collector never scans it.
// A pod of one IPv4 address, most pods of most clusters, costs 16 bytes
// in a sorted array; the others a 40-byte slot of a map. At 150,000 pods
// the store takes 22 bytes a pod of live heap, with its namespaces; in a
// map of 40-byte slots it took 89, of 16-byte slots 37: the map had just
// split its tables half empty (BenchmarkAutopathMemory).
type podStore struct {
	v4    *sortedMap[uint64, pod4]
	other map[uint64]podEntry
	nss   namespaceIDs
	// ns4 is the first namespace number a pod4 cannot hold: maxNS4, but
	// for tests.
	ns4 uint32
	// epoch numbers the lists; swept is the last that ended. Every pod is
	// marked with a list in [swept, epoch]; a list's end removes the pods
	// not marked with it.
	epoch, swept uint32
}

// pod4 is a pod of one IPv4 address and nothing else. Its mark is the low
// byte of its list's epoch, so begin renumbers the marks before a list
// could take an epoch some pod still carries: after 255 lists that were
// cut short in a row.
type pod4 struct {
	addr [4]byte
	tag  uint32 // namespace number << 8 | mark
}

// maxNS4 is the first namespace number a pod4 cannot hold.
const maxNS4 = 1 << 24

// podEntry is any other pod: its namespace, addresses and list.
type podEntry struct {
	ns    uint32
	addrs packedAddrs
	epoch uint32
}

func newPodStore() podStore {
	return podStore{v4: &sortedMap[uint64, pod4]{}, other: map[uint64]podEntry{}, nss: newNamespaceIDs(), ns4: maxNS4}
}

func (s *podStore) len() int { return s.v4.len() + len(s.other) }

// get is the namespace and addresses of the pod k, none if it holds none.
func (s *podStore) get(k uint64) (ns string, addrs packedAddrs) {
	if p, ok := s.v4.get(k); ok {
		return s.nss.name(p.tag >> 8), packedAddrs{v4: p.addr, has: 1}
	}
	if e, ok := s.other[k]; ok {
		return s.nss.name(e.ns), e.addrs
	}
	return "", packedAddrs{}
}

// put records that the pod k of namespace ns holds addrs (none: forget
// it), named by the open list if one is open.
func (s *podStore) put(k uint64, ns string, addrs packedAddrs) {
	if addrs.n() == 0 {
		s.v4.del(k)
		delete(s.other, k)
		return
	}
	id := s.nss.id(ns)
	if addrs.has == 1 && id < s.ns4 {
		delete(s.other, k)
		s.v4.set(k, pod4{addr: addrs.v4, tag: id<<8 | s.epoch&0xff})
		return
	}
	s.v4.del(k)
	s.other[k] = podEntry{id, addrs, s.epoch}
}

// begin opens a list.
func (s *podStore) begin() {
	s.epoch++
	if s.epoch-s.swept < 0x100 {
		return
	}
	s.v4.update(func(_ uint64, p *pod4) { p.tag = p.tag&^0xff | (s.epoch-1)&0xff })
	s.swept = s.epoch - 1
}

// sweep ends the open list: each pod it did not name is handed to gone
// and forgotten.
func (s *podStore) sweep(gone func(ns string, addrs packedAddrs)) {
	s.v4.deleteFunc(func(_ uint64, p pod4) bool {
		if p.tag&0xff == s.epoch&0xff {
			return false
		}
		gone(s.nss.name(p.tag>>8), packedAddrs{v4: p.addr, has: 1})
		return true
	})
	for k, e := range s.other {
		if e.epoch != s.epoch {
			gone(s.nss.name(e.ns), e.addrs)
			delete(s.other, k)
		}
	}
	s.swept = s.epoch
}
