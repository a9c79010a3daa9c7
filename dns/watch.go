package dns

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"

	"github.com/netplane/netplane/internal/informer"
	"github.com/netplane/netplane/internal/memory"
	"github.com/netplane/netplane/internal/runner"
)

const byService = "service"

// watcher keeps the Handler's index in step with the API server. Its views'
// handlers only note which Service or namespace changed, and the pods' sink
// which addresses each pod gave back and took; the runner rebuilds exactly
// those from the views and swaps the new index in, so a burst of events
// costs one swap and a change costs in proportion to the Services it
// touches, not to the cluster.
type watcher struct {
	h       *Handler
	metrics *metrics
	log     logr.Logger
	factory *informer.Factory
	runner  *runner.Runner
	bound   *memoryBound

	services, slices, nss *informer.Handle
	// pods starts the pods' sink and says when it has its first list;
	// nil without autopath or verified pod records.
	pods func(context.Context) cache.DoneChecker

	mu      sync.Mutex
	pending pending
}

type pending struct {
	svcs     map[svcKey]struct{}
	nss      map[string]struct{}
	pods     []podMove // in the order the API server sent them
	triggers []trigger
	synced   bool
	// listed is set when the pods were listed again (after an API server
	// restart, every reflector lists): the largest list's garbage is then
	// given back at once.
	listed bool
}

func (p *pending) empty() bool {
	return len(p.svcs) == 0 && len(p.nss) == 0 && len(p.pods) == 0 && len(p.triggers) == 0 && !p.synced && !p.listed
}

// trigger is an EndpointSlice change whose trigger time the programming
// latency is measured from once the change is served.
type trigger struct {
	at  time.Time
	svc svcKey
}

func newPending() pending {
	return pending{svcs: map[svcKey]struct{}{}, nss: map[string]struct{}{}}
}

// runningPods selects the pods that hold their addresses: finished pods
// give theirs back, and leaving them out on the server side keeps a reused
// address from naming the wrong pod.
var runningPods = fields.AndSelectors(
	fields.OneTermNotEqualSelector("status.phase", string(corev1.PodSucceeded)),
	fields.OneTermNotEqualSelector("status.phase", string(corev1.PodFailed)))

// newWatcher registers the index's views on f: slim Services,
// EndpointSlices and Namespaces, and, only when withPods, the pods' sink,
// read through pc's wire reader (typed Pods when pc is nil). Nothing is
// watched until run.
func newWatcher(f *informer.Factory, h *Handler, m *metrics, log logr.Logger, withPods bool, pc *podClient) *watcher {
	w := &watcher{h: h, metrics: m, log: log, factory: f, pending: newPending(), bound: newMemoryBound()}
	// Every change is applied at once: an index swap is cheap, and a burst
	// of events already coalesces into one while a swap runs.
	w.runner = runner.New(w.sync, runner.Options{})
	// Read by key and by Service: no namespace index.
	w.services = f.Register(informer.View{Kind: informer.Services, Name: "dns", Record: slim, NoNamespaceIndex: true})
	w.slices = f.Register(informer.View{Kind: informer.EndpointSlices, Name: "dns", Record: slim,
		Indexers: cache.Indexers{byService: sliceService}, NoNamespaceIndex: true})
	w.nss = f.Register(informer.View{Kind: informer.Namespaces, Name: "dns", Record: slim, NoNamespaceIndex: true})
	if withPods {
		sink := newPodSink(func(moves []podMove) {
			w.note(func(p *pending) { p.pods = append(p.pods, moves...) })
		})
		sink.listed = func() { w.note(func(p *pending) { p.listed = true }) }
		// An outage and the relist after it read parts of the executable
		// serving does not: error paths, a TLS handshake, the watch's decoding,
		// and the function tables the collector's stack scans read for the
		// new goroutines' frames (one page a fault with PagesOneByOne, 64 kB
		// without). Given back as the list goes, they are not all resident
		// at once: 15,000 pods relisted peaked at 38.5 MB instead of 42.9
		// (with fault-around).
		sink.chunk = memory.DropExecutablePages
		sink.relist = func() { memory.RelistGCPercent(relistGOGC) }
		if pc == nil {
			h := f.Register(informer.View{Kind: informer.Pods, Name: "dns", Fields: runningPods, Record: podRecord, Sink: sink})
			w.pods = func(context.Context) cache.DoneChecker { return h.Synced() }
		} else {
			w.pods = func(ctx context.Context) cache.DoneChecker {
				return f.RunCustom(ctx, informer.Custom{Kind: informer.Pods, Name: "dns", Example: &podInfo{},
					List: pc.list, Watch: pc.watch, Client: pc, Fields: runningPods, Record: podRecord, Sink: sink})
			}
		}
	}
	return w
}

// run starts the factory (idempotent: in a process of several roles, the
// first to start it starts every view) and follows the views until ctx
// ends. The index stays unsynced until every view has listed.
func (w *watcher) run(ctx context.Context) error {
	w.factory.Start(ctx)
	var regs []cache.DoneChecker
	add := func(v *informer.Handle, note func(obj any, fresh bool)) error {
		reg, err := v.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: func(obj any) { note(obj, true) },
			UpdateFunc: func(old, cur any) {
				// A relist hands every object over again as an update; one
				// of the same version changed nothing, and rebuilding every
				// Service would copy the whole index at once.
				if sameVersion(old, cur) {
					return
				}
				note(old, false)
				note(cur, true)
			},
			DeleteFunc: func(obj any) { note(obj, false) },
		})
		if err == nil {
			regs = append(regs, reg.HasSyncedChecker())
		}
		return err
	}
	if err := errors.Join(add(w.services, w.noteService), add(w.slices, w.noteSlice), add(w.nss, w.noteNamespace)); err != nil {
		return err
	}
	if w.pods != nil {
		regs = append(regs, w.pods(ctx))
	}
	go func() {
		// Told, not polling every 100 ms as WaitForCacheSync does.
		if cache.WaitFor(ctx, "", regs...) {
			w.note(func(p *pending) { p.synced = true })
			w.log.Info("caches synced, answering for the cluster zone")
		}
	}()
	go w.settle(ctx)
	w.runner.Run(ctx)
	return nil
}

// settleEvery is how often the memory bound looks at the steady state
// between index changes: the query path's caches fill without one.
const settleEvery = 10 * time.Second

// settle raises the memory bound as the steady state grows, except while
// an API server outage, and the relist that ends it, is under way.
func (w *watcher) settle(ctx context.Context) {
	wait.UntilWithContext(ctx, func(context.Context) {
		if !w.factory.Gate().Away() {
			w.bound.grown()
		}
	}, settleEvery)
}

// sameVersion reports whether two records of one object carry the same
// resource version.
func sameVersion(old, cur any) bool {
	v := func(obj any) string {
		switch o := obj.(type) {
		case *svcInfo:
			return o.resourceVersion
		case metav1.Object:
			return o.GetResourceVersion()
		}
		return ""
	}
	a := v(old)
	return a != "" && a == v(cur)
}

func sliceService(obj any) ([]string, error) {
	sl, ok := obj.(*sliceInfo)
	if !ok || sl.service == "" {
		return nil, nil
	}
	return []string{sl.namespace + "/" + sl.service}, nil
}

func unwrap(obj any) any {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return t.Obj
	}
	return obj
}

func (w *watcher) note(f func(*pending)) {
	w.mu.Lock()
	f(&w.pending)
	w.mu.Unlock()
	w.runner.Request()
}

func (w *watcher) noteService(obj any, _ bool) {
	if s, ok := unwrap(obj).(*svcInfo); ok {
		w.note(func(p *pending) { p.svcs[svcKey{s.namespace, s.name}] = struct{}{} })
	}
}

func (w *watcher) noteSlice(obj any, fresh bool) {
	sl, ok := unwrap(obj).(*sliceInfo)
	if !ok || sl.service == "" {
		return
	}
	k := svcKey{sl.namespace, sl.service}
	at, err := time.Parse(time.RFC3339, sl.trigger)
	w.note(func(p *pending) {
		p.svcs[k] = struct{}{}
		// Only changes after the first sync: the initial list replays
		// history, whose latency is not ours.
		if fresh && err == nil && w.h.Index().synced {
			p.triggers = append(p.triggers, trigger{at, k})
		}
	})
}

func (w *watcher) noteNamespace(obj any, _ bool) {
	if n, ok := unwrap(obj).(*nsInfo); ok {
		w.note(func(p *pending) { p.nss[n.name] = struct{}{} })
	}
}

// sync applies what is pending; every sync is the same, full or not, as
// the index is rebuilt from the views for each change.
func (w *watcher) sync(context.Context, bool) error {
	w.mu.Lock()
	p := w.pending
	w.pending = newPending()
	w.mu.Unlock()
	if !p.empty() {
		w.apply(p)
	}
	return nil
}

// apply rebuilds what p names from the caches and swaps in the new index.
func (w *watcher) apply(p pending) {
	c := w.h.Index().Edit()
	for k := range p.svcs {
		c.SetService(svcKey{k.ns, k.name}, w.build(k))
	}
	for ns := range p.nss {
		_, exists, _ := w.nss.Indexer().GetByKey(ns)
		c.SetNamespace(ns, exists)
	}
	for _, m := range p.pods {
		c.SetPod(m.ns, m.old, m.cur)
	}
	if p.synced {
		c.MarkSynced()
	}
	ix := c.Done(uint32(time.Now().Unix()))
	w.h.SetIndex(ix)
	if p.synced || p.listed && ix.synced {
		// Hand back the lists' garbage, and the executable's pages only
		// decoding them read, now rather than over the next minutes; what
		// is left is the steady state the next relist is bounded by.
		memory.ReleaseStartup()
		w.bound.listed()
	} else if !w.factory.Gate().Away() {
		w.bound.grown()
	}
	for _, t := range p.triggers {
		kind := "cluster_ip"
		if s := ix.service(t.svc.ns, t.svc.name); s != nil && s.kind == kindHeadless {
			kind = "headless"
		}
		w.metrics.programmed(kind, time.Since(t.at))
	}
}

func (w *watcher) build(k svcKey) *service {
	obj, _, _ := w.services.Indexer().GetByKey(k.ns + "/" + k.name)
	svc, ok := obj.(*svcInfo)
	if !ok {
		return nil
	}
	objs, _ := w.slices.Indexer().ByIndex(byService, k.ns+"/"+k.name)
	sls := make([]*sliceInfo, 0, len(objs))
	for _, o := range objs {
		if sl, ok := o.(*sliceInfo); ok {
			sls = append(sls, sl)
		}
	}
	return svc.spec.withEndpoints(sls)
}
