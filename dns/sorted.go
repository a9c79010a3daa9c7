package dns

import (
	"cmp"
	"hash/maphash"
	"slices"
)

// sortedMap is a map kept as sorted arrays in shards: each entry costs its
// key and value, with no control bytes and no empty slots. Go's maps split
// their tables half empty as they grow, so at 150,000 entries a map of
// IPv4 address to namespace number took 21 bytes an entry, this one 9
// (BenchmarkAutopathMemory). A lookup is a binary search in one shard of
// about n/256 entries; an insertion moves the shard's tail, a few
// kilobytes at that size.
type sortedMap[K cmp.Ordered, V any] struct {
	shards [sortedShards][]entry[K, V]
}

const sortedShards = 256

type entry[K cmp.Ordered, V any] struct {
	k K
	v V
}

var sortedSeed = maphash.MakeSeed()

func sortedShard[K cmp.Ordered](k K) int {
	return int(maphash.Comparable(sortedSeed, k) % sortedShards)
}

func find[K cmp.Ordered, V any](s []entry[K, V], k K) (int, bool) {
	return slices.BinarySearchFunc(s, k, func(e entry[K, V], k K) int { return cmp.Compare(e.k, k) })
}

func (m *sortedMap[K, V]) get(k K) (V, bool) {
	s := m.shards[sortedShard(k)]
	if i, ok := find(s, k); ok {
		return s[i].v, true
	}
	var zero V
	return zero, false
}

func (m *sortedMap[K, V]) len() int {
	n := 0
	for _, s := range m.shards {
		n += len(s)
	}
	return n
}

// set and del change m in place: for a map no reader shares.
func (m *sortedMap[K, V]) set(k K, v V) {
	i := sortedShard(k)
	s := m.shards[i]
	if j, ok := find(s, k); ok {
		s[j].v = v
	} else {
		m.shards[i] = insert(s, j, entry[K, V]{k, v})
	}
}

func (m *sortedMap[K, V]) del(k K) {
	i := sortedShard(k)
	if j, ok := find(m.shards[i], k); ok {
		m.shards[i] = shrink(slices.Delete(m.shards[i], j, j+1))
	}
}

// deleteFunc removes every entry f is true of.
func (m *sortedMap[K, V]) deleteFunc(f func(K, V) bool) {
	for i, s := range m.shards {
		m.shards[i] = shrink(slices.DeleteFunc(s, func(e entry[K, V]) bool { return f(e.k, e.v) }))
	}
}

// update hands f each entry's value to change in place: for a map no
// reader shares.
func (m *sortedMap[K, V]) update(f func(K, *V)) {
	for _, s := range m.shards {
		for i := range s {
			f(s[i].k, &s[i].v)
		}
	}
}

// insert puts e at s[i], growing s by an eighth when it is full: append's
// growth, by a half or more at a shard's few hundred entries, left 40% of
// the arrays empty.
func insert[E any](s []E, i int, e E) []E {
	if len(s) == cap(s) {
		s = append(make([]E, 0, len(s)+len(s)/8+4), s...)
	}
	s = s[:len(s)+1]
	copy(s[i+1:], s[i:])
	s[i] = e
	return s
}

// shrink gives back the room of a shard that lost most of its entries.
func shrink[E any](s []E) []E {
	if cap(s) > 2*len(s)+16 {
		return slices.Clip(slices.Clone(s))
	}
	return s
}

// sortedEditor derives a new sortedMap from one that readers share,
// copying a shard on its first write only. Its map is made on the first
// write too: a sortedMap is 6 kB of shard headers, which a change of the
// index that moves no pod need not copy.
type sortedEditor[K cmp.Ordered, V any] struct {
	base, m *sortedMap[K, V] // m is nil until the first write
	copied  [sortedShards]bool
}

func editSorted[K cmp.Ordered, V any](base *sortedMap[K, V]) *sortedEditor[K, V] {
	if base == nil {
		base = &sortedMap[K, V]{}
	}
	return &sortedEditor[K, V]{base: base}
}

// result is the map with the editor's writes: its base if none.
func (e *sortedEditor[K, V]) result() *sortedMap[K, V] {
	if e.m == nil {
		return e.base
	}
	return e.m
}

func (e *sortedEditor[K, V]) own(k K) {
	if e.m == nil {
		e.m = &sortedMap[K, V]{shards: e.base.shards}
	}
	if i := sortedShard(k); !e.copied[i] {
		s := e.m.shards[i]
		e.m.shards[i] = append(make([]entry[K, V], 0, len(s)+1), s...)
		e.copied[i] = true
	}
}

func (e *sortedEditor[K, V]) set(k K, v V) {
	e.own(k)
	e.m.set(k, v)
}

func (e *sortedEditor[K, V]) del(k K) {
	if _, ok := e.result().get(k); ok {
		e.own(k)
		e.m.del(k)
	}
}
