package dns

import (
	"context"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/netplane/netplane/internal/role"
)

const byService = "service"

// watcher keeps the Handler's index in step with the API server. Informer
// handlers only note which Service or namespace changed, and the pods' sink
// which addresses each pod gave back and took; one worker rebuilds exactly
// those from the informer caches and swaps the new index in, so a burst of events costs one swap and a change costs in proportion
// to the Services it touches, not to the cluster.
type watcher struct {
	h       *Handler
	metrics *metrics
	log     logr.Logger

	services cache.Store
	slices   cache.Indexer
	nss      cache.Store

	mu      sync.Mutex
	pending pending
	kick    chan struct{}
}

type pending struct {
	svcs     map[svcKey]struct{}
	nss      map[string]struct{}
	pods     []podMove // in the order the API server sent them
	triggers []trigger
	synced   bool
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

// startWatch starts the informers, the pods' reflector (only when withPods)
// and the worker. The index stays unsynced until every one has listed.
func startWatch(ctx context.Context, client kubernetes.Interface, h *Handler, m *metrics, log logr.Logger, withPods bool) {
	w := &watcher{h: h, metrics: m, log: log, pending: newPending(), kick: make(chan struct{}, 1)}
	f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(slim))
	svcs := client.CoreV1().Services(metav1.NamespaceAll)
	svcInf := cache.NewSharedIndexInformer(slimListWatch(client, keepSlim,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return svcs.List(ctx, o) },
		svcs.Watch), &corev1.Service{}, 0, cache.Indexers{})
	_ = svcInf.SetTransform(slim)
	sliceInf := f.Discovery().V1().EndpointSlices().Informer()
	nsInf := f.Core().V1().Namespaces().Informer()
	_ = sliceInf.AddIndexers(cache.Indexers{byService: sliceService})
	w.services, w.slices, w.nss = svcInf.GetStore(), sliceInf.GetIndexer(), nsInf.GetStore()

	var regs []cache.DoneChecker
	add := func(inf cache.SharedIndexInformer, note func(obj any, fresh bool)) {
		reg, _ := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { note(obj, true) },
			UpdateFunc: func(old, cur any) { note(old, false); note(cur, true) },
			DeleteFunc: func(obj any) { note(obj, false) },
		})
		regs = append(regs, reg.HasSyncedChecker())
	}
	add(svcInf, w.noteService)
	add(sliceInf, w.noteSlice)
	add(nsInf, w.noteNamespace)
	f.Start(ctx.Done())
	go svcInf.RunWithContext(ctx)
	if withPods {
		regs = append(regs, w.watchPods(ctx, client))
	}
	go func() {
		// Told, not polling every 100 ms as WaitForCacheSync does.
		if cache.WaitFor(ctx, "", regs...) {
			w.note(func(p *pending) { p.synced = true })
			log.Info("caches synced, answering for the cluster zone")
		}
	}()
	go w.run(ctx)
}

// watchPods feeds pods to the index through a podSink, with no informer
// cache; the checker it returns is done when the first list is in.
func (w *watcher) watchPods(ctx context.Context, client kubernetes.Interface) cache.DoneChecker {
	// Finished pods give their address back; leaving them out on the server
	// side keeps a reused address from naming the wrong pod.
	selector := fields.AndSelectors(
		fields.OneTermNotEqualSelector("status.phase", string(corev1.PodSucceeded)),
		fields.OneTermNotEqualSelector("status.phase", string(corev1.PodFailed))).String()
	pods := client.CoreV1().Pods(metav1.NamespaceAll)
	lw := slimListWatch(client, keepPod,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = selector
			return pods.List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = selector
			return pods.Watch(ctx, o)
		})
	sink := newPodSink(func(moves []podMove) {
		w.note(func(p *pending) { p.pods = append(p.pods, moves...) })
	})
	r := cache.NewReflectorWithOptions(lw, &corev1.Pod{}, sink, cache.ReflectorOptions{Name: "dns pods"})
	go r.RunWithContext(ctx)
	return sink
}

func sliceService(obj any) ([]string, error) {
	sl, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok || sl.Labels[discoveryv1.LabelServiceName] == "" {
		return nil, nil
	}
	return []string{sl.Namespace + "/" + sl.Labels[discoveryv1.LabelServiceName]}, nil
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
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

func (w *watcher) noteService(obj any, _ bool) {
	if s, ok := unwrap(obj).(*svcInfo); ok {
		w.note(func(p *pending) { p.svcs[svcKey{s.namespace, s.name}] = struct{}{} })
	}
}

func (w *watcher) noteSlice(obj any, fresh bool) {
	sl, ok := unwrap(obj).(*discoveryv1.EndpointSlice)
	if !ok || sl.Labels[discoveryv1.LabelServiceName] == "" {
		return
	}
	k := svcKey{sl.Namespace, sl.Labels[discoveryv1.LabelServiceName]}
	at, err := time.Parse(time.RFC3339, sl.Annotations[triggerTimeAnnotation])
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
	if n, ok := unwrap(obj).(*corev1.Namespace); ok {
		w.note(func(p *pending) { p.nss[n.Name] = struct{}{} })
	}
}

func (w *watcher) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.kick:
		}
		w.mu.Lock()
		p := w.pending
		w.pending = newPending()
		w.mu.Unlock()
		w.apply(p)
	}
}

// apply rebuilds what p names from the caches and swaps in the new index.
func (w *watcher) apply(p pending) {
	c := w.h.Index().Edit()
	for k := range p.svcs {
		c.SetService(svcKey{k.ns, k.name}, w.build(k))
	}
	for ns := range p.nss {
		_, exists, _ := w.nss.GetByKey(ns)
		c.SetNamespace(ns, exists)
	}
	for _, m := range p.pods {
		c.SetPod(m.ref, m.old, m.cur)
	}
	if p.synced {
		c.MarkSynced()
	}
	ix := c.Done(uint32(time.Now().Unix()))
	w.h.SetIndex(ix)
	if p.synced {
		// Hand back the initial lists' garbage and start-up's pages now
		// rather than over the next minutes.
		role.ReleaseStartup()
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
	obj, _, _ := w.services.GetByKey(k.ns + "/" + k.name)
	svc, ok := obj.(*svcInfo)
	if !ok {
		return nil
	}
	objs, _ := w.slices.ByIndex(byService, k.ns+"/"+k.name)
	sls := make([]*discoveryv1.EndpointSlice, 0, len(objs))
	for _, o := range objs {
		if sl, ok := o.(*discoveryv1.EndpointSlice); ok {
			sls = append(sls, sl)
		}
	}
	return svc.spec.withEndpoints(sls)
}
