// Package endpointslice is netplane's EndpointSlice controller: it keeps
// the EndpointSlices of every Service with a selector true to its Pods, as
// kube-controller-manager's endpointslice controller does. The controller
// role (package controllers) runs it beside the mirroring controller.
package endpointslice

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	esrec "k8s.io/endpointslice"
	"k8s.io/endpointslice/topologycache"
	esutil "k8s.io/endpointslice/util"

	"github.com/netplane/netplane/controllers/internal/kit"
	"github.com/netplane/netplane/internal/informer"
)

// ControllerName is the managed-by label value of the slices this controller
// owns. It is kube-controller-manager's value on purpose: consumers and the
// garbage collector treat our slices exactly as theirs, and a cluster can
// switch between the two controllers without orphaning a slice.
const ControllerName = "endpointslice-controller.k8s.io"

// sliceChangeMinDelay delays syncs caused by foreign changes to our slices
// (a hand edit, the garbage collector), so that a burst of them costs one
// sync, as in kube-controller-manager.
const sliceChangeMinDelay = time.Second

// Options tune a Controller.
type Options struct {
	MaxEndpointsPerSlice int32
	// BatchPeriod delays syncs caused by Pod events so that the changes of
	// one Service within the window cost one sync.
	BatchPeriod time.Duration
	// Budget, when set, is the write rate limit of the client: workers
	// reserve a write token before they take a Service (see kit.WriteBudget).
	Budget *kit.WriteBudget
}

// Controller keeps the EndpointSlices of Services with a selector true to
// their Pods. The slice planning is k8s.io/endpointslice's Reconciler, the
// library kube-controller-manager itself runs; this type is the shell
// around it: informer handlers, a rate-limited queue, stale-cache
// protection, events and metrics.
type Controller struct {
	log      logr.Logger
	client   kubernetes.Interface
	services corelisters.ServiceLister
	pods     corelisters.PodLister
	slices   discoverylisters.EndpointSliceLister
	nodes    corelisters.NodeLister
	// podIndex, serviceIndex and sliceIndex are the Pod, Service and slice
	// caches with the indexes of index.go.
	podIndex     cache.Indexer
	serviceIndex cache.Indexer
	sliceIndex   cache.Indexer

	tracker    *esutil.EndpointSliceTracker
	triggers   *esutil.TriggerTimeTracker
	reconciler *esrec.Reconciler
	splicer    *splicer // the reconciler's writes of narrowed syncs pass through it
	recorder   record.EventRecorder
	metrics    *kit.Metrics
	queue      *kit.Queue
	loop       *kit.Loop
	batch      time.Duration
	// waiting holds the Services whose sync found the slice cache behind
	// our writes, until the informer delivers them.
	waiting *kit.CacheWait
	// podChanges feeds Pod events to mapPods, which finds their Services
	// off the informer's goroutine.
	podChanges *podChanges
	// last is what each Service's last successful sync saw, so that the
	// next one can be narrowed (narrow.go); nodeEpoch counts the Node
	// changes that can change endpoints (zones), which void them all.
	last      lastSyncs
	nodeEpoch atomic.Uint64

	// topology serves the service.kubernetes.io/topology-mode=Auto hints;
	// Node changes queue a recount of zones in topologyQueue.
	topology      *topologycache.TopologyCache
	topologyQueue *kit.Queue
	// handlers are done once each event handler saw its first list.
	handlers []cache.DoneChecker
}

// Indexers are the indexes the Controller reads, by resource: its Sources
// must carry them (RegisterViews declares them on the process's views).
func Indexers() map[informer.Kind]cache.Indexers {
	return map[informer.Kind]cache.Indexers{
		informer.Pods:           {podLabelIndex: podLabelKeys},
		informer.Services:       {serviceSelectorIndex: serviceSelectorKeys},
		informer.EndpointSlices: {sliceServiceIndex: sliceServiceKeys},
	}
}

// New builds a Controller on src (whose caches carry Indexers), adds its
// event handlers and registers its metrics on reg. It writes through
// client.
func New(log logr.Logger, client kubernetes.Interface, src kit.Sources, recorder record.EventRecorder, reg prometheus.Registerer, opts Options) (*Controller, error) {
	c := &Controller{
		log:          log,
		services:     corelisters.NewServiceLister(src.Services.Indexer()),
		pods:         corelisters.NewPodLister(src.Pods.Indexer()),
		slices:       discoverylisters.NewEndpointSliceLister(src.EndpointSlices.Indexer()),
		nodes:        corelisters.NewNodeLister(src.Nodes.Indexer()),
		podIndex:     src.Pods.Indexer(),
		serviceIndex: src.Services.Indexer(),
		sliceIndex:   src.EndpointSlices.Indexer(),
		tracker:      esutil.NewEndpointSliceTracker(),
		triggers:     esutil.NewTriggerTimeTracker(),
		recorder:     recorder,
		batch:        opts.BatchPeriod,
		queue:        kit.NewQueue("endpointslice"),
		podChanges:   newPodChanges(),
		topology:     topologycache.NewTopologyCache(),
		topologyQueue: kit.NewQueueOf(func() workqueue.TypedRateLimitingInterface[string] {
			return workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
				workqueue.TypedRateLimitingQueueConfig[string]{Name: "endpointslice_topology"})
		}),
	}
	for name, ix := range map[string]cache.Indexer{podLabelIndex: c.podIndex, serviceSelectorIndex: c.serviceIndex, sliceServiceIndex: c.sliceIndex} {
		if _, ok := ix.GetIndexers()[name]; !ok {
			return nil, fmt.Errorf("the cache given to the EndpointSlice controller has no %s index", name)
		}
	}
	m, err := kit.NewMetrics(reg, "endpointslice", kit.CountManaged(c.slices, ControllerName))
	if err != nil {
		return nil, err
	}
	c.metrics = m
	c.waiting = &kit.CacheWait{Queue: c.queue, Fresh: c.cacheFresh}
	c.loop = &kit.Loop{Queue: c.queue, Metrics: m, Log: log, Waiting: c.waiting,
		Budget: opts.Budget, Sync: func(_ context.Context, key string) error { return c.syncService(key) },
		Keys: src.Services.Indexer().ListKeys}
	c.client = kit.CountWrites(client, m, opts.Budget, log)
	c.splicer = newSplicer()
	c.reconciler = esrec.NewReconciler(splicingClient{c.client, c.splicer}, c.nodes, opts.MaxEndpointsPerSlice, c.tracker, c.topology, recorder,
		ControllerName, esrec.WithPreferSameTrafficDistributionEnabled(true))
	return c, c.addHandlers(src)
}

func (c *Controller) addHandlers(src kit.Sources) error {
	handlers := []struct {
		src kit.Source
		h   cache.ResourceEventHandler
	}{
		{src.Services, cache.ResourceEventHandlerFuncs{
			AddFunc:    c.enqueueObject,
			UpdateFunc: func(_, cur any) { c.enqueueObject(cur) },
			DeleteFunc: c.enqueueObject,
		}},
		{src.Pods, cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { c.onPod(nil, obj) },
			UpdateFunc: c.onPod,
			DeleteFunc: func(obj any) { c.onPod(nil, obj) },
		}},
		{src.EndpointSlices, kit.SliceEvents(ControllerName, c.tracker, c.enqueueForSlice)},
		{src.EndpointSlices, c.waiting.Handler(ControllerName, sliceServiceKey)},
		{src.Nodes, cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { c.onNodeAddOrDelete() },
			UpdateFunc: c.onNodeUpdate,
			DeleteFunc: func(any) { c.onNodeAddOrDelete() },
		}},
	}
	for _, x := range handlers {
		reg, err := x.src.AddEventHandler(x.h)
		if err != nil {
			return fmt.Errorf("adding event handler: %w", err)
		}
		c.handlers = append(c.handlers, reg.HasSyncedChecker())
	}
	return nil
}

// Synced are done once every event handler has been handed its caches'
// first lists.
func (c *Controller) Synced() []cache.DoneChecker { return c.handlers }

// Run syncs Services with workers goroutines until ctx ends, and returns
// once every sync in progress finished. It may run again once it returned
// (see kit.Loop); each run recounts the zones.
func (c *Controller) Run(ctx context.Context, workers int) {
	c.log.Info("starting EndpointSlice controller", "workers", workers)
	c.topologyQueue.Add(topologyKey)
	var wg sync.WaitGroup
	wg.Go(func() { wait.UntilWithContext(ctx, c.topologyWorker, time.Second) })
	wg.Go(func() { c.mapPods(ctx) })
	c.loop.Run(ctx, workers)
	c.topologyQueue.Renew()
	wg.Wait()
	c.log.Info("stopped EndpointSlice controller")
}

// idle reports whether no Pod change waits to be mapped and no Service is
// queued or being synced.
func (c *Controller) idle() bool { return c.podChanges.idle() && c.loop.Idle() }

// syncService converges the slices of one Service, given as namespace/name.
func (c *Controller) syncService(key string) error {
	c.log.V(5).Info("Syncing Service", "service", key)
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return err
	}
	svc, err := c.services.Services(ns).Get(name)
	if apierrors.IsNotFound(err) {
		// The garbage collector deletes the slices through their ownerRefs.
		c.forget(ns, name)
		return nil
	}
	if err != nil {
		return err
	}
	if svc.Spec.Type == corev1.ServiceTypeExternalName || svc.Spec.Selector == nil {
		// Such Services get no managed slices; users write their own.
		c.metrics.SetDesired(key, 0)
		return nil
	}
	pods, err := selectPods(c.podIndex, c.pods.Pods(ns).List, ns, svc.Spec.Selector)
	if err != nil {
		return err
	}
	existing, err := c.ownSlices(svc)
	if err != nil {
		return err
	}
	if c.tracker.StaleSlices(svc, existing) {
		return kit.ErrStaleCache
	}
	// Computed even when nothing will be written, so the tracker forgets
	// the pod changes this sync accounts for.
	trigger := c.triggers.ComputeEndpointLastChangeTriggerTime(ns, svc, pods)
	c.metrics.SetDesired(key, desiredEndpoints(svc, pods))
	if err := c.plan(key, svc, pods, existing, trigger); errors.Is(err, kit.ErrStaleCache) {
		return err
	} else if err != nil {
		c.recorder.Eventf(svc, corev1.EventTypeWarning, "FailedToUpdateEndpointSlices",
			"Error updating EndpointSlices for Service %s/%s: %v", ns, name, err)
		return err
	}
	return nil
}

// plan runs the planner on the Service key, narrowed to the slices whose
// pods changed when it can be (narrow.go), and records what it saw for the
// next sync.
func (c *Controller) plan(key string, svc *corev1.Service, pods []*corev1.Pod, existing []*discovery.EndpointSlice, trigger time.Time) error {
	nodes := c.nodeEpoch.Load()
	last := c.last.get(key)
	n, narrowed := narrow(last, svc, nodes, pods, existing, c.written)
	var err error
	switch {
	case !narrowed:
		err = c.reconciler.Reconcile(c.log, svc, pods, existing, trigger)
	case len(n.slices) > 0:
		// (Without slices there is nothing to plan; the planner would take
		// it for a Service without endpoints.)
		c.splicer.begin(svc.Namespace, svc.Name, n.cuts)
		err = c.reconciler.Reconcile(c.log, svc, n.pods, n.slices, trigger)
		if c.splicer.end(svc.Namespace, svc.Name, n.cuts) {
			// Never with pods whose endpoints stay in their slices
			// (splice.go); should it happen, a write that went through
			// leaves the slices seen stale.
			narrowed = false
			if c.tracker.StaleSlices(svc, existing) {
				c.last.set(key, nil)
				return kit.ErrStaleCache
			}
			err = c.reconciler.Reconcile(c.log, svc, pods, existing, trigger)
		}
	}
	switch {
	case err != nil:
		c.last.set(key, nil)
		return err
	case narrowed:
		last.update(n.changed, existing)
	default:
		c.last.set(key, recordSync(svc, nodes, pods, existing))
	}
	return nil
}

// written reports whether s is at a generation this controller wrote.
func (c *Controller) written(s *discovery.EndpointSlice) bool {
	return c.tracker.Has(s) && !c.tracker.ShouldSync(s)
}

// cacheFresh reports whether the slice cache shows every write made for
// the Service key (or the Service is gone, so there is nothing to wait for).
func (c *Controller) cacheFresh(key string) bool {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return true
	}
	svc, err := c.services.Services(ns).Get(name)
	if err != nil {
		return true
	}
	existing, err := c.ownSlices(svc)
	return err != nil || !c.tracker.StaleSlices(svc, existing)
}

// ownSlices lists the slices of svc this controller manages, minus those
// already being deleted (waiting on them would stall the Service).
func (c *Controller) ownSlices(svc *corev1.Service) ([]*discovery.EndpointSlice, error) {
	all, err := c.sliceIndex.ByIndex(sliceServiceIndex, svc.Namespace+"/"+svc.Name)
	if err != nil {
		return nil, err
	}
	out := make([]*discovery.EndpointSlice, 0, len(all))
	for _, obj := range all {
		if s, ok := obj.(*discovery.EndpointSlice); ok && s.Labels[discovery.LabelManagedBy] == ControllerName && s.DeletionTimestamp == nil {
			out = append(out, s)
		}
	}
	return out, nil
}

func (c *Controller) forget(ns, name string) {
	c.last.set(ns+"/"+name, nil)
	c.triggers.DeleteService(ns, name)
	c.reconciler.DeleteService(ns, name)
	c.tracker.DeleteService(ns, name)
	c.metrics.SetDesired(ns+"/"+name, 0)
}

func (c *Controller) enqueueObject(obj any) { kit.Enqueue(c.queue, obj) }

// onPod records what a Pod event changed; mapPods finds the Services.
// At log level 5 it logs the pod, for the benchmark's traces.
func (c *Controller) onPod(old, cur any) {
	if change, ok := changeOf(old, cur); ok {
		if log := c.log.V(5); log.Enabled() {
			key, _ := cache.DeletionHandlingMetaNamespaceKeyFunc(cur)
			log.Info("Pod changed", "pod", key)
		}
		c.podChanges.add(change)
	}
}

// mapPods queues every Service whose membership or endpoints a recorded Pod
// change can affect, after the batch period so that changes coalesce, until
// ctx ends.
func (c *Controller) mapPods(ctx context.Context) {
	for {
		batch := c.podChanges.take(ctx)
		if batch == nil {
			return
		}
		for _, change := range batch {
			services, err := servicesToUpdate(c.serviceIndex, change.projection())
			if err != nil {
				utilruntime.HandleError(err)
				continue
			}
			for svc := range services {
				c.queue.AddAfter(svc, c.batch)
			}
		}
		c.podChanges.done()
	}
}

func (c *Controller) enqueueForSlice(s *discovery.EndpointSlice) {
	if key, ok := sliceServiceKey(s); ok {
		c.queue.AddAfter(key, max(sliceChangeMinDelay, c.batch))
	}
}

// sliceServiceKey is the key of the Service a slice is labelled with; ok is
// false for a slice without the label, which is not ours to sync.
func sliceServiceKey(s *discovery.EndpointSlice) (string, bool) {
	key, err := esrec.ServiceControllerKey(s)
	return key, err == nil
}

// desiredEndpoints counts the endpoints svc should have over all its
// address families: each included pod once per family it has an IP of.
func desiredEndpoints(svc *corev1.Service, pods []*corev1.Pod) int {
	n := 0
	for _, p := range pods {
		if !esutil.ShouldPodBeInEndpoints(p, true) {
			continue
		}
		for _, ip := range p.Status.PodIPs {
			if familyWanted(svc, ip.IP) {
				n++
			}
		}
	}
	return n
}

func familyWanted(svc *corev1.Service, ip string) bool {
	addr, err := netip.ParseAddr(ip)
	if err != nil {
		return false
	}
	want := corev1.IPv4Protocol
	if addr.Is6() && !addr.Is4In6() {
		want = corev1.IPv6Protocol
	}
	if len(svc.Spec.IPFamilies) == 0 {
		return true // headless without families: both
	}
	return slices.Contains(svc.Spec.IPFamilies, want)
}

// topologyKey is the only item of topologyQueue: "recount the zones".
const topologyKey = "topology"

func (c *Controller) onNodeAddOrDelete() {
	c.nodeEpoch.Add(1)
	c.topologyQueue.Add(topologyKey)
}

// onNodeUpdate recounts zones when a Node's readiness or zone changed; the
// zone label may be set by a cloud provider after the Node registered. A
// zone change also changes the endpoints of the Node's pods.
func (c *Controller) onNodeUpdate(oldObj, curObj any) {
	o, ok1 := oldObj.(*corev1.Node)
	n, ok2 := curObj.(*corev1.Node)
	if !ok1 || !ok2 {
		return
	}
	zoneChanged := o.Labels[corev1.LabelTopologyZone] != n.Labels[corev1.LabelTopologyZone]
	if zoneChanged {
		c.nodeEpoch.Add(1)
	}
	if zoneChanged || nodeReady(o) != nodeReady(n) {
		c.topologyQueue.Add(topologyKey)
	}
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// topologyWorker feeds Node changes to the topology-aware hints and resyncs
// the Services whose zones became overloaded.
func (c *Controller) topologyWorker(context.Context) {
	q := c.topologyQueue.Current()
	for {
		key, quit := q.Get()
		if quit {
			return
		}
		nodes, err := c.nodes.List(labels.Everything())
		if err == nil {
			c.topology.SetNodes(c.log, nodes)
			for _, svc := range c.topology.GetOverloadedServices() {
				c.queue.Add(svc)
			}
		}
		q.Forget(key)
		q.Done(key)
	}
}
