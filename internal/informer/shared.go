package informer

import (
	"fmt"
	"maps"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"
)

// entry is what a resource read by several views keeps of one object: its
// key and version, and each view's record (nil where the view does not
// select the object). A sink view's record is kept too: the sink is told
// what an update replaces and what a delete takes away.
type entry struct {
	namespace, name, resourceVersion string
	parts                            []any
}

func (e *entry) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Namespace: e.namespace, Name: e.name, ResourceVersion: e.resourceVersion}
}

func (e *entry) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }
func (e *entry) DeepCopyObject() runtime.Object   { return e } // never changed once made

// entryOf makes the entry of an API object.
func (r *resource) entryOf(obj runtime.Object) any {
	m, err := metaOf(obj)
	if err != nil {
		return nil
	}
	e := &entry{namespace: m.GetNamespace(), name: m.GetName(), resourceVersion: m.GetResourceVersion(), parts: make([]any, len(r.views))}
	for i, h := range r.views {
		e.parts[i] = h.record(obj)
	}
	return e
}

// partOf is view i's record in a stored object (an entry, or a tombstone
// of one), nil when it has none.
func partOf(obj any, i int) any {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		if p := partOf(t.Obj, i); p != nil {
			return cache.DeletedFinalStateUnknown{Key: t.Key, Obj: p}
		}
		return nil
	}
	if e, ok := obj.(*entry); ok {
		return e.parts[i]
	}
	return nil
}

// indexers are the entries' indexes: the namespace index unless no view
// wants it (entries answer it through their key), and each view's own under
// a name of its own (viewIndexName), applied to the view's record.
func (r *resource) indexers() cache.Indexers {
	out := cache.Indexers{}
	for _, h := range r.views {
		if !h.view.NoNamespaceIndex {
			out = withNamespace(out)
		}
	}
	for _, h := range r.views {
		for name, fn := range h.view.Indexers {
			out[viewIndexName(h.i, name)] = func(obj any) ([]string, error) {
				if e, ok := obj.(*entry); ok {
					if obj = e.parts[h.i]; obj == nil {
						return nil, nil
					}
				}
				return fn(obj)
			}
		}
	}
	return out
}

func viewIndexName(i int, name string) string {
	if name == cache.NamespaceIndex {
		return name
	}
	return fmt.Sprintf("%d/%s", i, name)
}

// indexers are a view's indexes: its own, and the namespace index unless it
// has none.
func (h *Handle) indexers() cache.Indexers {
	if h.view.NoNamespaceIndex {
		return maps.Clone(h.view.Indexers)
	}
	return withNamespace(h.view.Indexers)
}

func withNamespace(ix cache.Indexers) cache.Indexers {
	out := cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}
	for k, v := range ix {
		out[k] = v
	}
	return out
}

// viewIndexer is one view's window on a shared store: its records only.
// It is read-only; the informer alone writes the store.
type viewIndexer struct {
	h  *Handle
	in cache.Indexer
}

func (v viewIndexer) parts(objs []any) []any {
	out := make([]any, 0, len(objs))
	for _, o := range objs {
		if p := partOf(o, v.h.i); p != nil {
			out = append(out, p)
		}
	}
	return out
}

func (v viewIndexer) List() []any { return v.parts(v.in.List()) }

func (v viewIndexer) ListKeys() []string {
	var out []string
	for _, o := range v.in.List() {
		if p := partOf(o, v.h.i); p != nil {
			if k, err := cache.MetaNamespaceKeyFunc(o); err == nil {
				out = append(out, k)
			}
		}
	}
	return out
}

func (v viewIndexer) Get(obj any) (any, bool, error) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		return nil, false, err
	}
	return v.GetByKey(key)
}

func (v viewIndexer) GetByKey(key string) (any, bool, error) {
	o, ok, err := v.in.GetByKey(key)
	if !ok || err != nil {
		return nil, false, err
	}
	p := partOf(o, v.h.i)
	return p, p != nil, nil
}

func (v viewIndexer) Index(name string, obj any) ([]any, error) {
	objs, err := v.in.Index(viewIndexName(v.h.i, name), obj)
	return v.parts(objs), err
}

func (v viewIndexer) IndexKeys(name, value string) ([]string, error) {
	objs, err := v.ByIndex(name, value)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(objs))
	for _, o := range objs {
		if k, err := cache.MetaNamespaceKeyFunc(o); err == nil {
			out = append(out, k)
		}
	}
	return out, nil
}

func (v viewIndexer) ListIndexFuncValues(name string) []string {
	return v.in.ListIndexFuncValues(viewIndexName(v.h.i, name))
}

func (v viewIndexer) ByIndex(name, value string) ([]any, error) {
	objs, err := v.in.ByIndex(viewIndexName(v.h.i, name), value)
	return v.parts(objs), err
}

func (v viewIndexer) GetIndexers() cache.Indexers { return v.h.indexers() }

var errReadOnly = fmt.Errorf("informer: a view's indexer is read-only; the informer writes it")

func (v viewIndexer) AddIndexers(cache.Indexers) error { return errReadOnly }
func (v viewIndexer) Add(any) error                    { return errReadOnly }
func (v viewIndexer) Update(any) error                 { return errReadOnly }
func (v viewIndexer) Delete(any) error                 { return errReadOnly }
func (v viewIndexer) Replace([]any, string) error      { return errReadOnly }
func (v viewIndexer) Resync() error                    { return nil }
func (v viewIndexer) LastStoreSyncResourceVersion() string {
	return v.in.LastStoreSyncResourceVersion()
}
func (v viewIndexer) Bookmark(rv string) {}

// viewHandler hands a view's handler its records: an object entering the
// view (its record appearing) is an add, leaving it a delete, and a change
// elsewhere in the entry that leaves the view without a record is nothing.
type viewHandler struct {
	h    *Handle
	next cache.ResourceEventHandler
}

func (v viewHandler) OnAdd(obj any, initial bool) {
	if p := partOf(obj, v.h.i); p != nil {
		v.next.OnAdd(p, initial)
	}
}

func (v viewHandler) OnUpdate(oldObj, newObj any) {
	o, n := partOf(oldObj, v.h.i), partOf(newObj, v.h.i)
	switch {
	case o == nil && n == nil:
	case o == nil:
		v.next.OnAdd(n, false)
	case n == nil:
		v.next.OnDelete(o)
	default:
		v.next.OnUpdate(o, n)
	}
}

func (v viewHandler) OnDelete(obj any) {
	if p := partOf(obj, v.h.i); p != nil {
		v.next.OnDelete(p)
	}
}

// sinkHandler feeds a sink view from a shared informer: the first list
// comes as adds, then changes one by one.
type sinkHandler struct{ h *Handle }

func (s sinkHandler) OnAdd(obj any, _ bool) {
	if p := partOf(obj, s.h.i); p != nil {
		_ = s.h.view.Sink.Add(p)
	}
}

func (s sinkHandler) OnUpdate(oldObj, newObj any) {
	o, n := partOf(oldObj, s.h.i), partOf(newObj, s.h.i)
	switch {
	case n != nil:
		_ = s.h.view.Sink.Update(n)
	case o != nil:
		_ = s.h.view.Sink.Delete(o)
	}
}

func (s sinkHandler) OnDelete(obj any) {
	p := partOf(obj, s.h.i)
	if t, ok := p.(cache.DeletedFinalStateUnknown); ok {
		p = t.Obj
	}
	if p != nil {
		_ = s.h.view.Sink.Delete(p)
	}
}
