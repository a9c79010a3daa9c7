package nft

import (
	"encoding/binary"
	"hash/maphash"
	"iter"
	"unsafe"
)

// A set its builder does not change at every sync is kept packed: its ids
// end to end in one byte array, found through an open-addressing index of
// offsets. The NetworkPolicy feature's sets hold about 1.4 million
// elements at 150,000 pods and 10,000 policies; as Go maps they took
// 37 bytes an element (52 MB, the largest part of the node role's heap),
// packed an IPv4 address takes 11 to 17 (16.5 for 100,000).

// packed is an immutable set of ids, each with a value. Ids read from it
// alias its bytes, which never change, so they may be kept.
type packed struct {
	data  []byte   // per element: the id's length (uvarint), the id, its value (4 bytes) if vals
	index []uint32 // linear probing; offset of an element in data plus one, 0 for empty
	n     int
	vals  bool // values kept: some value is not 1
}

var packSeed = maphash.MakeSeed()

// pack is m packed.
func pack(m map[string]uint32) *packed {
	size, vals := 0, false
	for id, v := range m {
		size += uvarintLen(len(id)) + len(id)
		vals = vals || v != 1
	}
	if vals {
		size += 4 * len(m)
	}
	p := &packed{data: make([]byte, 0, size), index: make([]uint32, indexSize(len(m))), vals: vals}
	for id, v := range m {
		p.insert(id, v)
	}
	return p
}

// PackedSet is a new set, packed from the start, of the ids each gives to
// add (copied, so the caller may reuse its buffer; an id given twice is
// kept once); n is about how many it gives. A table builder rendering a
// large set whole makes it so, without a map and a string per element in
// between.
func PackedSet(name string, spec SetSpec, n int, each func(add func(id []byte))) *Set {
	p := &packed{data: make([]byte, 0, 8*n), index: make([]uint32, indexSize(n))}
	each(func(id []byte) {
		if _, ok := p.get(unsafe.String(unsafe.SliceData(id), len(id))); ok {
			return
		}
		if 3*len(p.index) < 4*(p.n+1) {
			p.grow()
		}
		p.insert(unsafe.String(unsafe.SliceData(id), len(id)), 1)
	})
	if cap(p.data)-len(p.data) > len(p.data)/8 {
		p.data = append(make([]byte, 0, len(p.data)), p.data...)
	}
	s := &Set{Name: name, Spec: spec}
	if p.n > 0 {
		s.packed = p
	}
	return s
}

// insert appends id to p's bytes and indexes it; the index has room.
func (p *packed) insert(id string, v uint32) {
	off := len(p.data)
	p.data = binary.AppendUvarint(p.data, uint64(len(id)))
	p.data = append(p.data, id...)
	if p.vals {
		p.data = binary.LittleEndian.AppendUint32(p.data, v)
	}
	p.place(id, uint32(off+1))
	p.n++
}

// place puts an element's offset (plus one) in the index.
func (p *packed) place(id string, ref uint32) {
	mask := len(p.index) - 1
	i := int(maphash.String(packSeed, id)) & mask
	for p.index[i] != 0 {
		i = (i + 1) & mask
	}
	p.index[i] = ref
}

// grow doubles the index and places every element again.
func (p *packed) grow() {
	p.index = make([]uint32, 2*len(p.index))
	for off := 0; off < len(p.data); {
		id, _, next := p.at(off)
		p.place(id, uint32(off+1))
		off = next
	}
}

// indexSize is the smallest power of two that holds n at a load of at most
// three quarters.
func indexSize(n int) int {
	s := 4
	for 3*s < 4*n {
		s *= 2
	}
	return s
}

func uvarintLen(n int) int {
	l := 1
	for ; n >= 0x80; n >>= 7 {
		l++
	}
	return l
}

// at is the element at offset off and the offset of the next.
func (p *packed) at(off int) (id string, v uint32, next int) {
	l, k := binary.Uvarint(p.data[off:])
	start := off + k
	next = start + int(l)
	id = unsafe.String(unsafe.SliceData(p.data[start:next]), int(l))
	v = 1
	if p.vals {
		v = binary.LittleEndian.Uint32(p.data[next:])
		next += 4
	}
	return id, v, next
}

func (p *packed) get(id string) (uint32, bool) {
	mask := len(p.index) - 1
	for i := int(maphash.String(packSeed, id)) & mask; p.index[i] != 0; i = (i + 1) & mask {
		if got, v, _ := p.at(int(p.index[i] - 1)); got == id {
			return v, true
		}
	}
	return 0, false
}

func (p *packed) all(yield func(string, uint32) bool) {
	for off := 0; off < len(p.data); {
		id, v, next := p.at(off)
		if !yield(id, v) {
			return
		}
		off = next
	}
}

// thaw is p as a map whose keys alias p's bytes: no id is copied.
func (p *packed) thaw() map[string]uint32 {
	m := make(map[string]uint32, p.n)
	for id, v := range p.all {
		m[id] = v
	}
	return m
}

// elems is a set's elements as one of the two forms: a map or packed.
type elems struct {
	m map[string]uint32
	p *packed
}

func (e elems) len() int {
	if e.p != nil {
		return e.p.n
	}
	return len(e.m)
}

func (e elems) get(id string) (uint32, bool) {
	if e.p != nil {
		return e.p.get(id)
	}
	v, ok := e.m[id]
	return v, ok
}

func (e elems) all() iter.Seq2[string, uint32] {
	if e.p != nil {
		return e.p.all
	}
	return func(yield func(string, uint32) bool) {
		for id, v := range e.m {
			if !yield(id, v) {
				return
			}
		}
	}
}

// pick is the elements of e that ids names, as a map.
func (e elems) pick(ids map[string]bool) map[string]uint32 {
	out := make(map[string]uint32, len(ids))
	for id := range ids {
		if v, ok := e.get(id); ok {
			out[id] = v
		}
	}
	return out
}
