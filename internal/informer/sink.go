package informer

import (
	"reflect"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"
)

// sinkStore is the store a lone sink view's reflector writes to: it hands
// the sink the view's records, never whole objects, and is done with the
// first list.
type sinkStore struct {
	h    *Handle
	done chan struct{}
}

func newSinkStore(h *Handle) *sinkStore { return &sinkStore{h: h, done: make(chan struct{})} }

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

// Replace hands the sink the records of list, made in list's own array: a
// store owns the list it is given.
func (s *sinkStore) Replace(list []any, rv string) error {
	recs := list[:0]
	for _, o := range list {
		if r := s.rec(o); r != nil {
			recs = append(recs, r)
		}
	}
	clear(list[len(recs):])
	err := s.h.view.Sink.Replace(recs, rv)
	select {
	case <-s.done:
	default:
		close(s.done)
	}
	return err
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
