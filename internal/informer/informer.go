// Package informer is the process's one layer of informers: one list and one
// watch per resource, whatever roles run, each role reading its own record
// of every object.
//
// A role registers a View of a resource: which objects it wants (Labels,
// Fields), how it slims one into its record (Record), its indexes. When one
// view reads a resource, the informer's store holds that view's records and
// the view's selectors narrow the list and the watch on the API server,
// which is what the role alone would do. When several views read it, the
// store holds one entry per object with every view's record side by side
// (shared.go); each view still sees only its own records, through
// View.Indexer and View.AddEventHandler, and the selectors are applied here.
// Lists are paged and slimmed page by page (list.go), so a first list never
// holds every object of a large cluster decoded at once; a lone view whose
// sink takes lists as they arrive (ListSink) never holds even every record
// at once, and a relist hands the store its own record of every object
// whose version did not change, not a second copy. Every informer
// goes through the factory's outage gate, so after an API server outage
// all of them are back within seconds (resume.go).
package informer

import (
	"context"
	"fmt"
	"reflect"
	"sync"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/netplane/netplane/internal/outage"
)

// View is one consumer's reading of a resource.
type View struct {
	// Kind is the resource.
	Kind Kind
	// Name says who reads (a role or feature), for logs and errors.
	Name string
	// Labels and Fields select the objects the view sees; nil means all.
	// Fields may name only the fields Kind lists as selectable.
	Labels labels.Selector
	Fields fields.Selector
	// Record turns a selected API object into the view's record: never
	// nil, with a GetObjectMeta method (metav1.ObjectMetaAccessor, for its
	// key), never changed once made. Nil keeps the object whole.
	Record func(obj runtime.Object) any
	// Indexers index the view's records.
	Indexers cache.Indexers
	// NoNamespaceIndex leaves out the namespace index, which every view has
	// otherwise, for a view read by key, as a whole and through its own
	// Indexers only: it costs an index entry per object, and only typed
	// listers' List of a namespace reads it.
	NoNamespaceIndex bool
	// Sink, when set, receives the view's records as a reflector would
	// hand them to a store (Replace, Add, Update, Delete), and nothing of
	// the view is kept here: for a consumer that keeps its own, smaller
	// state. A sink view has no Indexer.
	Sink cache.ReflectorStore
}

// Factory makes the informers of one process.
type Factory struct {
	client kubernetes.Interface
	gate   *outage.Gate

	mu        sync.Mutex
	resources map[Kind]*resource
	sources   map[Kind]kubernetes.Interface // resources read elsewhere than client
}

// resource is one watched resource and the views reading it.
type resource struct {
	kind     Kind
	def      kind // how it is listed and watched
	views    []*Handle
	started  bool
	informer cache.SharedIndexInformer // nil for a lone sink view (a reflector)
	shared   bool                      // entries hold every view's record
}

// Handle is a registered view.
type Handle struct {
	view View
	res  *resource
	i    int // the view's place in an entry
	// alone: the view is its resource's only one, whose Fields the API
	// server applies (it refuses a field it cannot select by, never
	// ignores one), so they are not matched again here. Set before the
	// resource starts.
	alone bool

	mu     sync.Mutex
	synced cache.DoneChecker
}

// New returns a factory listing and watching through client (for large
// lists, a client that asks for protobuf), whose informers live through
// API server outages at one gate probing the API server's /readyz.
func New(client kubernetes.Interface) *Factory {
	return NewWithGate(client, outage.New(outage.DefaultPolicy, outage.Readyz(client.Discovery().RESTClient()), klog.Background().WithName("apiserver")))
}

// NewWithGate is New with the gate given: the process's, whose transport
// client passes through (outage.Gate.Config).
func NewWithGate(client kubernetes.Interface, gate *outage.Gate) *Factory {
	return &Factory{client: client, gate: gate, resources: map[Kind]*resource{}}
}

// Gate is the factory's outage gate, for its metrics.
func (f *Factory) Gate() *outage.Gate { return f.gate }

// Client is the client the factory lists and watches through, whose
// requests pass its gate: for a reader of its own (RunCustom) that must
// behave as the factory's informers do through an outage.
func (f *Factory) Client() kubernetes.Interface { return f.client }

// Source has the factory list and watch resource k through c instead of
// its client: a node role reading pods from pod relays, which serve pods
// as the API server does but never as a streamed list. Call it before
// Start. Requests still pass the factory's gate.
func (f *Factory) Source(k Kind, c kubernetes.Interface) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.sources == nil {
		f.sources = map[Kind]kubernetes.Interface{}
	}
	f.sources[k] = listedOnly{c}
}

// listedOnly is a client whose server cannot stream a first list.
type listedOnly struct{ kubernetes.Interface }

func (listedOnly) IsWatchListSemanticsUnSupported() bool { return true }

// Register adds a view. Every view of a resource must be registered before
// the factory starts that resource (Start); registering one later is a
// programming error and panics, as its records could not be made.
func (f *Factory) Register(v View) *Handle {
	if _, ok := kinds[v.Kind]; !ok {
		panic(fmt.Sprintf("informer: %s registered a view of unknown kind %q", v.Name, v.Kind))
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	r := f.resources[v.Kind]
	if r == nil {
		r = &resource{kind: v.Kind, def: kinds[v.Kind]}
		f.resources[v.Kind] = r
	}
	if r.started {
		panic(fmt.Sprintf("informer: %s registered a view of %s after its informer started", v.Name, v.Kind))
	}
	h := &Handle{view: v, res: r, i: len(r.views)}
	r.views = append(r.views, h)
	return h
}

// Start starts the informer of every resource that has views and is not
// running yet; they stop when ctx ends.
func (f *Factory) Start(ctx context.Context) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range f.resources {
		if r.started {
			continue
		}
		r.started = true
		f.start(ctx, r)
	}
}

func (f *Factory) start(ctx context.Context, r *resource) {
	k := r.def
	m := f.gate.Member(ctx, string(r.kind))
	var client kubernetes.Interface = f.client
	if c, ok := f.sources[r.kind]; ok {
		client = c
	}
	list, watchFn := k.calls(client)
	if len(r.views) == 1 {
		h := r.views[0]
		h.alone = true
		v := h.view
		if v.Sink != nil {
			h.setSynced(runSink(ctx, h, m, func(stream *sinkStore) cache.ListerWatcher {
				return listWatch(client, m, list, watchFn, v.Labels, v.Fields, h.record, stream)
			}))
			return
		}
		var inf cache.SharedIndexInformer
		keep := unchanged(func() cache.Store { return inf.GetIndexer() }, h.record)
		lw := listWatch(client, m, list, watchFn, v.Labels, v.Fields, keep, nil)
		inf = cache.NewSharedIndexInformerWithOptions(lw, k.example, cache.SharedIndexInformerOptions{Indexers: h.indexers()})
		_ = inf.SetTransform(transformFunc(k.example, keep)) // cannot fail before Run
		_ = inf.SetWatchErrorHandlerWithContext(resume(m))
		r.informer = inf
		h.setSynced(inf.HasSyncedChecker())
		go inf.RunWithContext(ctx)
		return
	}
	r.shared = true
	var inf cache.SharedIndexInformer
	keep := unchanged(func() cache.Store { return inf.GetIndexer() }, r.entryOf)
	lw := listWatch(client, m, list, watchFn, nil, nil, keep, nil)
	inf = cache.NewSharedIndexInformerWithOptions(lw, k.example, cache.SharedIndexInformerOptions{Indexers: r.indexers()})
	_ = inf.SetTransform(transformFunc(k.example, keep))
	_ = inf.SetWatchErrorHandlerWithContext(resume(m))
	r.informer = inf
	for _, h := range r.views {
		if h.view.Sink != nil {
			reg, _ := inf.AddEventHandler(sinkHandler{h})
			h.setSynced(reg.HasSyncedChecker())
		} else {
			h.setSynced(inf.HasSyncedChecker())
		}
	}
	go inf.RunWithContext(ctx)
}

// record is the view's record of an API object, nil when the view does not
// select it.
func (h *Handle) record(obj runtime.Object) any {
	if !h.selects(obj) {
		return nil
	}
	if h.view.Record == nil {
		return obj
	}
	return h.view.Record(obj)
}

func (h *Handle) selects(obj runtime.Object) bool {
	fs := h.view.Fields
	if h.alone {
		fs = nil // the API server's
	}
	if h.view.Labels == nil && fs == nil {
		return true
	}
	m, err := metaOf(obj)
	if err != nil {
		return false
	}
	if h.view.Labels != nil && !h.view.Labels.Matches(labels.Set(m.GetLabels())) {
		return false
	}
	return fs == nil || fs.Matches(h.res.def.fields(obj))
}

func (h *Handle) setSynced(d cache.DoneChecker) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.synced = d
}

// Synced is done once the view's first list is in its store (or sink).
// Valid after Start.
func (h *Handle) Synced() cache.DoneChecker {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.synced == nil {
		panic(fmt.Sprintf("informer: %s asked whether %s synced before the factory started it", h.view.Name, h.view.Kind))
	}
	return h.synced
}

// Indexer is the view's records, with its indexes and the namespace index.
// Valid after Start; typed listers can be built on it for a whole-object view.
func (h *Handle) Indexer() cache.Indexer {
	if h.view.Sink != nil {
		panic(fmt.Sprintf("informer: %s's view of %s is a sink and has no indexer", h.view.Name, h.view.Kind))
	}
	if h.res.informer == nil {
		panic(fmt.Sprintf("informer: %s asked for the %s indexer before the factory started it", h.view.Name, h.view.Kind))
	}
	if !h.res.shared {
		return h.res.informer.GetIndexer()
	}
	return viewIndexer{h: h, in: h.res.informer.GetIndexer()}
}

// AddEventHandler calls handler with the view's records: an object
// entering the view is an add, leaving it a delete. Valid after Start.
func (h *Handle) AddEventHandler(handler cache.ResourceEventHandler) (cache.ResourceEventHandlerRegistration, error) {
	if h.res.informer == nil {
		return nil, fmt.Errorf("informer: %s added a handler to %s before the factory started it, or to a sink view", h.view.Name, h.view.Kind)
	}
	if !h.res.shared {
		return h.res.informer.AddEventHandler(handler)
	}
	return h.res.informer.AddEventHandler(viewHandler{h: h, next: handler})
}

// unchanged is make, except that an object the store holds at the same
// resource version gets the stored record back. A relist (after an API
// server restart every object is handed over again) then holds the stored
// records a second time, not a second copy of each beside the store until
// the store takes the list; records are never changed once made, and a
// view's record depends on the object alone.
func unchanged(store func() cache.Store, make func(runtime.Object) any) func(runtime.Object) any {
	return func(obj runtime.Object) any {
		m, err := metaOf(obj)
		if err != nil || m.GetResourceVersion() == "" {
			return make(obj)
		}
		key := cache.NewObjectName(m.GetNamespace(), m.GetName()).String() // the store's key
		if old, ok, _ := store().GetByKey(key); ok {
			if om, err := metaOf(old); err == nil && om.GetResourceVersion() == m.GetResourceVersion() {
				return old
			}
		}
		return make(obj)
	}
}

// transformFunc applies make to objects of the example's type and passes
// anything else (a record the list made already) unchanged, as transforms
// must be idempotent.
func transformFunc(example runtime.Object, make func(runtime.Object) any) cache.TransformFunc {
	want := reflect.TypeOf(example)
	return func(obj any) (any, error) {
		if l, ok := obj.(*listed); ok {
			return l.rec, nil
		}
		o, ok := obj.(runtime.Object)
		if !ok || reflect.TypeOf(o) != want {
			return obj, nil
		}
		if rec := make(o); rec != nil {
			return rec, nil
		}
		// A lone view's selectors were sent to the API server, which sends
		// only what they select: an object reaching here unselected means
		// the server ignored them, and the view must not see it.
		return nil, fmt.Errorf("informer: the API server sent a %T its selectors exclude", o)
	}
}
