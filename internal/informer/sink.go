package informer

import (
	"reflect"
	"sync"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// ListSink is a Sink that takes a list as it arrives rather than whole: a
// lone view of it never holds every listed record at once beside the
// sink's own state, as a reflector's Replace does (150,000 pods: 23 MB at
// every relist). BeginList opens a list; its records come through Add,
// a change the stream carries before the list ends too (Delete for a
// deletion: Add must take a record it already holds); EndList closes it, and what the sink holds that the list did
// not name since BeginList is gone. A list cut short is never closed: the
// next one opens with BeginList again.
type ListSink interface {
	cache.ReflectorStore
	BeginList()
	EndList(resourceVersion string) error
}

// sinkStore is the store a lone sink view's reflector writes to: it hands
// the sink the view's records, never whole objects, and is done with the
// first list. A ListSink is handed each list as it arrives (streamedList,
// initialEvents) and the reflector's Replace, which then has nothing left
// to hand, closes it.
type sinkStore struct {
	h      *Handle
	done   chan struct{}
	stream ListSink // the sink, when it takes lists as they arrive

	// mu orders the lists: a list or watch given up may still be applying
	// a record in its own goroutine, which must not land in the next list.
	mu    sync.Mutex
	open  uint64 // the number of the list being streamed; 0: none
	lists uint64
}

func newSinkStore(h *Handle) *sinkStore {
	s := &sinkStore{h: h, done: make(chan struct{})}
	s.stream, _ = h.view.Sink.(ListSink)
	return s
}

// begin opens a list in the sink and returns its number.
func (s *sinkStore) begin() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.beginLocked()
}

func (s *sinkStore) beginLocked() uint64 {
	s.lists++
	s.open = s.lists
	s.stream.BeginList()
	return s.open
}

// listed hands the sink (to: its Add, Update or Delete) a record or object
// of list n, if n is still the list being streamed.
func (s *sinkStore) listed(n uint64, obj any, to func(any) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.open == n {
		_ = s.forward(obj, to)
	}
}

// endList closes the list being streamed, with whatever the reflector
// still hands over (nothing, unless the list was not streamed: then it is
// opened here).
func (s *sinkStore) endList(list []any, rv string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.open == 0 {
		s.beginLocked()
	}
	for _, o := range list {
		_ = s.forward(o, s.stream.Add)
	}
	s.open = 0
	return s.stream.EndList(rv)
}

// initialEvents applies a watch-list's initial events to the sink as they
// arrive and hands the reflector only the rest, from the bookmark that
// ends them: the reflector's temporary store, which would hold every
// record until then, stays empty, and its Replace closes the list.
func (s *sinkStore) initialEvents(w watch.Interface) watch.Interface {
	n := s.begin()
	initial := true // read and written by the filter's one goroutine
	return watch.Filter(w, func(e watch.Event) (watch.Event, bool) {
		if !initial {
			return e, true
		}
		switch e.Type {
		case watch.Added, watch.Modified:
			s.listed(n, e.Object, s.stream.Add)
			return e, false
		case watch.Deleted:
			s.listed(n, e.Object, s.stream.Delete)
			return e, false
		case watch.Bookmark:
			initial = !endsInitialEvents(e.Object)
		}
		return e, true
	})
}

// endsInitialEvents reports whether a bookmark is the one ending a
// watch-list's initial events.
func endsInitialEvents(obj runtime.Object) bool {
	m, err := meta.Accessor(obj)
	return err == nil && m.GetAnnotations()[metav1.InitialEventsAnnotationKey] == "true"
}

// rec is the view's record of an object from the reflector: a list item
// already made (listed) or a watch event's whole object.
func (s *sinkStore) rec(obj any) any {
	switch o := obj.(type) {
	case *listed:
		return o.rec
	case cache.DeletedFinalStateUnknown:
		return s.rec(o.Obj)
	case runtime.Object:
		if reflect.TypeOf(o) == reflect.TypeOf(s.h.res.def.example) {
			return s.h.record(o)
		}
	}
	return obj // a record made already (a watch-list's temporary store)
}

func (s *sinkStore) Add(obj any) error    { return s.forward(obj, s.h.view.Sink.Add) }
func (s *sinkStore) Update(obj any) error { return s.forward(obj, s.h.view.Sink.Update) }
func (s *sinkStore) Delete(obj any) error { return s.forward(obj, s.h.view.Sink.Delete) }

func (s *sinkStore) forward(obj any, to func(any) error) error {
	if r := s.rec(obj); r != nil {
		return to(r)
	}
	return nil
}

// Replace closes a ListSink's list, or hands another sink the records of
// list, made in list's own array: a store owns the list it is given.
func (s *sinkStore) Replace(list []any, rv string) error {
	var err error
	if s.stream != nil {
		err = s.endList(list, rv)
	} else {
		err = s.replace(list, rv)
	}
	select {
	case <-s.done:
	default:
		close(s.done)
	}
	return err
}

func (s *sinkStore) replace(list []any, rv string) error {
	recs := list[:0]
	for _, o := range list {
		if r := s.rec(o); r != nil {
			recs = append(recs, r)
		}
	}
	clear(list[len(recs):])
	return s.h.view.Sink.Replace(recs, rv)
}

// Transformer slims what a watch-list streams into the reflector's
// temporary store, so even the first list never holds whole objects.
func (s *sinkStore) Transformer() cache.TransformFunc {
	return func(obj any) (any, error) {
		if r := s.rec(obj); r != nil {
			return r, nil
		}
		return obj, nil
	}
}

func (s *sinkStore) Resync() error                        { return nil }
func (s *sinkStore) List() []any                          { return nil }
func (s *sinkStore) ListKeys() []string                   { return nil }
func (s *sinkStore) Get(any) (any, bool, error)           { return nil, false, nil }
func (s *sinkStore) GetByKey(string) (any, bool, error)   { return nil, false, nil }
func (s *sinkStore) LastStoreSyncResourceVersion() string { return "" }
func (s *sinkStore) Bookmark(string)                      {}

// Name and Done make the store a cache.DoneChecker.
func (s *sinkStore) Name() string          { return s.h.view.Name + " " + string(s.h.view.Kind) }
func (s *sinkStore) Done() <-chan struct{} { return s.done }
