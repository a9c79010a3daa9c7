package relay

import (
	"bytes"
	"slices"
	"sort"
	"strconv"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// maxLog is how many changes the store keeps for watches that resume: at
// about 250 bytes a change, 25 MB. A node role whose watch broke resumes
// from its last version if the change after it is still kept, and lists
// again otherwise.
const maxLog = 100_000

// Store is the relay's state: every pod's digest as the API server last
// gave it, and the changes to the digests in order, each with the API
// server's resource version at which the relay learnt it. A change the
// digest does not see (most status updates) is no change here: nodes
// receive nothing for it.
//
// It is the sink of the relay's pod reflector (informer.ListSink): a list
// (after the relay's start, or after an API server outage) is compared
// with what the store holds and becomes the changes it makes, published
// together at the list's version, so that node roles watching the relay
// never list again because the API server went away.
type Store struct {
	maxLog int

	mu      sync.Mutex
	objs    map[string]*entry
	sorted  []string // the keys in order, for paged lists
	log     []change
	seq     uint64 // the sequence number of log[0]
	floor   uint64 // a watch may resume from any version from here on
	rv      uint64 // the newest version the store has
	synced  bool
	listing map[string]bool // keys named by the list under way; nil: none
	pending []change        // the list's changes, published at its end
	wake    chan struct{}   // closed and replaced at each change
}

// entry is one pod's digest.
type entry struct {
	same []byte // the digest without its version: equal bytes, equal digests
	pod  []byte // the digest as a list item
}

// change is one published change: a whole frame of a watch stream.
type change struct {
	at    uint64
	frame []byte
}

// NewStore returns an empty store, unsynced until its first list ends.
func NewStore() *Store {
	return &Store{maxLog: maxLog, objs: map[string]*entry{}, wake: make(chan struct{})}
}

func key(p *v1.Pod) string { return p.Namespace + "/" + p.Name }

func version(s string) uint64 {
	n, _ := strconv.ParseUint(s, 10, 64)
	return n
}

// Add, Update and Delete take the reflector's records: digests (Digest).
func (s *Store) Add(obj any) error    { s.upsert(obj.(*v1.Pod)); return nil }
func (s *Store) Update(obj any) error { s.upsert(obj.(*v1.Pod)); return nil }

func (s *Store) Delete(obj any) error {
	p := obj.(*v1.Pod)
	s.mu.Lock()
	defer s.mu.Unlock()
	k := key(p)
	if _, ok := s.objs[k]; !ok {
		return nil
	}
	delete(s.objs, k)
	s.unsort(k)
	s.record(version(p.ResourceVersion), watch.Deleted, p)
	return nil
}

func (s *Store) upsert(p *v1.Pod) {
	rv := p.ResourceVersion
	p.ResourceVersion = ""
	same := mustMarshal(p)
	p.ResourceVersion = rv
	s.mu.Lock()
	defer s.mu.Unlock()
	k := key(p)
	if s.listing != nil {
		s.listing[k] = true
	}
	old, ok := s.objs[k]
	if ok && bytes.Equal(old.same, same) {
		s.advance(version(rv))
		return
	}
	if !ok {
		i, _ := slices.BinarySearch(s.sorted, k)
		s.sorted = slices.Insert(s.sorted, i, k)
	}
	s.objs[k] = &entry{same: same, pod: mustMarshal(p)}
	t := watch.Modified
	if !ok {
		t = watch.Added
	}
	s.record(version(rv), t, p)
}

// record publishes a change at version at, or keeps it for the end of the
// list under way.
func (s *Store) record(at uint64, t watch.EventType, p *v1.Pod) {
	c := change{at: at, frame: frame(t, p)}
	if s.listing != nil {
		s.pending = append(s.pending, c)
		return
	}
	s.publish(c)
	s.advance(at)
}

func (s *Store) publish(cs ...change) {
	s.log = append(s.log, cs...)
	if over := len(s.log) - s.maxLog; over > 0 {
		s.floor = max(s.floor, s.log[over-1].at)
		s.seq += uint64(over)
		s.log = slices.Clone(s.log[over:])
	}
	s.notify()
}

// notify wakes every watch waiting for a change.
func (s *Store) notify() {
	close(s.wake)
	s.wake = make(chan struct{})
}

// unsort takes k out of the sorted keys: a move of the keys after it, some
// hundred microseconds at 150,000 pods, where sorting them all again for
// the next page would take tens of milliseconds.
func (s *Store) unsort(k string) {
	if i, ok := slices.BinarySearch(s.sorted, k); ok {
		s.sorted = slices.Delete(s.sorted, i, i+1)
	}
}

func (s *Store) advance(rv uint64) {
	if rv > s.rv {
		s.rv = rv
		s.notify()
	}
}

// BeginList opens a list: what it does not name by its end is deleted.
func (s *Store) BeginList() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.listing, s.pending = map[string]bool{}, nil
}

// EndList closes the list at its version: the pods it did not name are
// gone, and its changes are published at that version, in one piece.
func (s *Store) EndList(resourceVersion string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	at := version(resourceVersion)
	if len(s.objs) > len(s.listing) {
		// Pods gone while the relay did not watch, any number of them:
		// the keys are filtered once.
		s.sorted = slices.DeleteFunc(s.sorted, func(k string) bool { return !s.listing[k] })
	}
	for k, e := range s.objs {
		if !s.listing[k] {
			delete(s.objs, k)
			last := &v1.Pod{}
			_ = last.Unmarshal(e.pod) // its own bytes
			last.ResourceVersion = resourceVersion
			s.pending = append(s.pending, change{frame: frame(watch.Deleted, last)})
		}
	}
	for i := range s.pending {
		s.pending[i].at = at
	}
	first := !s.synced
	s.listing, s.synced = nil, true
	if first {
		// Nothing watched the relay before its first list: its changes are
		// the list itself, which a watch never resumes into.
		s.floor, s.pending = at, nil
	}
	s.publish(s.pending...)
	s.pending = nil
	s.advance(at)
	return nil
}

// Replace is a whole list at once.
func (s *Store) Replace(list []any, resourceVersion string) error {
	s.BeginList()
	for _, o := range list {
		s.upsert(o.(*v1.Pod))
	}
	return s.EndList(resourceVersion)
}

func (s *Store) Resync() error                      { return nil }
func (s *Store) List() []any                        { return nil }
func (s *Store) ListKeys() []string                 { return nil }
func (s *Store) Get(any) (any, bool, error)         { return nil, false, nil }
func (s *Store) GetByKey(string) (any, bool, error) { return nil, false, nil }

// Synced reports whether the first list has ended.
func (s *Store) Synced() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.synced
}

// Len is how many pods the store holds.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.objs)
}

// Page is one page of a list: its items, the list's version and the key
// after which the next page starts ("" when this one is the last). A
// list's pages are read from the store as it is when each is asked for;
// with the watch from the first page's version, which replays every change
// since, the reader ends at the same state.
func (s *Store) Page(after string, limit int) (items [][]byte, rv uint64, next string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := 0
	if after != "" {
		i = sort.SearchStrings(s.sorted, after)
		if i < len(s.sorted) && s.sorted[i] == after {
			i++
		}
	}
	for ; i < len(s.sorted) && (limit <= 0 || len(items) < limit); i++ {
		items = append(items, s.objs[s.sorted[i]].pod)
	}
	if i < len(s.sorted) && len(items) > 0 {
		next = s.sorted[i-1]
	}
	return items, s.rv, next
}

// Cursor is a watch's place in the store's changes.
type Cursor struct {
	seq uint64 // the next change's sequence number
	rv  uint64 // the newest version the watch was told of
}

// Since returns the cursor of a watch resuming after version rv, false
// when the changes after it are no longer kept (the watcher must list
// again), or when the store has not reached rv yet.
func (s *Store) Since(rv uint64) (Cursor, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.synced || rv < s.floor || rv > s.rv {
		return Cursor{}, false
	}
	i := sort.Search(len(s.log), func(i int) bool { return s.log[i].at > rv })
	return Cursor{seq: s.seq + uint64(i), rv: rv}, true
}

// Next returns the frames after c, the cursor after them, and a channel
// closed at the next change; ok is false when c fell out of the kept
// changes (a watcher too slow to keep up: it must list again).
func (s *Store) Next(c Cursor) (frames [][]byte, next Cursor, wake <-chan struct{}, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.seq < s.seq {
		return nil, c, nil, false
	}
	for _, ch := range s.log[c.seq-s.seq:] {
		frames = append(frames, ch.frame)
	}
	c.seq = s.seq + uint64(len(s.log))
	return frames, c, s.wake, true
}

// Changed is closed at the store's next change.
func (s *Store) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.wake
}

// Version is the newest version the store has.
func (s *Store) Version() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rv
}
