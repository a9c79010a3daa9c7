package dns

import (
	"hash/maphash"
	"maps"
	"net/netip"
	"slices"
)

// shardCount splits each map of the index so that a change copies one
// shard (1/64 of the map), not the whole cluster's worth of records.
const shardCount = 64

var seed = maphash.MakeSeed()

// cowMap is an immutable map in shards. Readers use it without locks; a
// writer derives a new map sharing every shard it did not touch.
type cowMap[K comparable, V any] struct {
	shards [shardCount]map[K]V
}

func shardOf[K comparable](k K) int { return int(maphash.Comparable(seed, k) % shardCount) }

func (m *cowMap[K, V]) get(k K) (V, bool) {
	v, ok := m.shards[shardOf(k)][k]
	return v, ok
}

// cowEditor collects changes to a cowMap; each shard is copied on its
// first write only, so a batch of changes to one shard copies it once.
type cowEditor[K comparable, V any] struct {
	m      *cowMap[K, V]
	copied [shardCount]bool
}

func edit[K comparable, V any](base *cowMap[K, V]) *cowEditor[K, V] {
	m := &cowMap[K, V]{}
	if base != nil {
		m.shards = base.shards
	}
	return &cowEditor[K, V]{m: m}
}

func (e *cowEditor[K, V]) shard(k K) map[K]V {
	i := shardOf(k)
	if !e.copied[i] {
		e.m.shards[i] = maps.Clone(e.m.shards[i])
		if e.m.shards[i] == nil {
			e.m.shards[i] = map[K]V{}
		}
		e.copied[i] = true
	}
	return e.m.shards[i]
}

func (e *cowEditor[K, V]) get(k K) (V, bool) { return e.m.get(k) }
func (e *cowEditor[K, V]) set(k K, v V)      { e.shard(k)[k] = v }
func (e *cowEditor[K, V]) del(k K) {
	if _, ok := e.m.get(k); ok {
		delete(e.shard(k), k)
	}
}

// Index is one immutable snapshot of everything the cluster zone answers
// from. The server reads the current one through an atomic pointer; the
// watcher derives the next one from it and swaps it in, so a query never
// sees half of a change and never waits for a lock.
type Index struct {
	synced     bool   // false until the informers delivered their first list
	serial     uint32 // unix time of the last change a query could see
	services   *cowMap[svcKey, *service]
	namespaces *cowMap[string, struct{}]
	reverse    ptrIndex
	pods       podTable
}

// NewIndex is the empty, not yet synced index a server starts with.
func NewIndex() *Index {
	return &Index{
		services:   &cowMap[svcKey, *service]{},
		namespaces: &cowMap[string, struct{}]{},
		reverse:    newPtrIndex(),
		pods:       newPodTable(),
	}
}

func (ix *Index) service(ns, name string) *service {
	s, _ := ix.services.get(svcKey{ns, name})
	return s
}

func (ix *Index) namespaceExists(ns string) bool {
	_, ok := ix.namespaces.get(ns)
	return ok
}

// podNamespace is the namespace of a pod with address a; autopath uses it to
// find a client's search path.
func (ix *Index) podNamespace(a netip.Addr) (string, bool) {
	return ix.pods.namespace(a)
}

func (ix *Index) podIn(a netip.Addr, ns string) bool { return ix.pods.holds(a, ns) }

// Change is a batch of edits that becomes the next Index in one swap.
type Change struct {
	base       *Index
	services   *cowEditor[svcKey, *service]
	namespaces *cowEditor[string, struct{}]
	reverse    ptrEditor
	pods       *podTableEditor
	changed    bool
	synced     bool
}

// Edit starts a Change from ix.
func (ix *Index) Edit() *Change {
	return &Change{
		base:       ix,
		services:   edit(ix.services),
		namespaces: edit(ix.namespaces),
		reverse:    ix.reverse.edit(),
		pods:       ix.pods.edit(),
		synced:     ix.synced,
	}
}

// SetService replaces the records of the Service k (nil removes them) and
// its reverse entries. It reports whether anything a query sees changed.
// The reverse map names the Service, not the names it gives (made per
// query from the Service's records), so only addresses the Service gains
// or loses change it.
func (c *Change) SetService(k svcKey, s *service) bool {
	old, _ := c.services.get(k)
	if old.equal(s) {
		return false
	}
	was, is := old.addrs(), s.addrs()
	for _, a := range was {
		if _, keep := slices.BinarySearchFunc(is, a, netip.Addr.Compare); !keep {
			c.reverse.remove(a, k)
		}
	}
	shared := &k // one key for all the addresses gained
	for _, a := range is {
		if _, had := slices.BinarySearchFunc(was, a, netip.Addr.Compare); !had {
			c.reverse.add(a, shared)
		}
	}
	if s == nil {
		c.services.del(k)
	} else {
		c.services.set(k, s)
	}
	c.changed = true
	return true
}

// SetNamespace records whether a namespace exists.
func (c *Change) SetNamespace(ns string, exists bool) {
	if _, had := c.namespaces.get(ns); had == exists {
		return
	}
	if exists {
		c.namespaces.set(ns, struct{}{})
	} else {
		c.namespaces.del(ns)
	}
	c.changed = true
}

// SetPod moves a pod of namespace ns from its old addresses to its new
// ones (none when it is gone or finished). old must be where the pod was:
// the index keeps of each pod only its namespace, once per address it holds.
func (c *Change) SetPod(ns string, old, cur []netip.Addr) {
	for _, a := range old {
		c.pods.remove(a, ns)
	}
	for _, a := range cur {
		c.pods.add(a, ns)
	}
	if len(old) > 0 || len(cur) > 0 {
		c.changed = true
	}
}

// MarkSynced makes the next Index authoritative: before it, names the index
// does not know are SERVFAIL, not NXDOMAIN.
func (c *Change) MarkSynced() {
	if !c.synced {
		c.synced = true
		c.changed = true
	}
}

// Done returns the next Index; serial is the unix time stamped on it when
// something changed. A batch with no visible change returns the base.
func (c *Change) Done(serial uint32) *Index {
	if !c.changed {
		return c.base
	}
	if serial <= c.base.serial {
		serial = c.base.serial + 1
	}
	return &Index{
		synced:     c.synced,
		serial:     serial,
		services:   c.services.m,
		namespaces: c.namespaces.m,
		reverse:    c.reverse.done(),
		pods:       c.pods.done(),
	}
}
