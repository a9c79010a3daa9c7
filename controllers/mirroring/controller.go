package mirroring

//lint:file-ignore SA1019 mirroring reads the Endpoints API, deprecated since v1.33, by design: it exists for users who still write Endpoints.

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"
	esutil "k8s.io/endpointslice/util"

	"github.com/netplane/netplane/controllers/internal/kit"
)

// Options tune a Controller.
type Options struct {
	// MaxEndpointsPerSubset bounds the addresses mirrored from one subset.
	MaxEndpointsPerSubset int32
}

// Controller mirrors Endpoints of selector-less Services into slices.
type Controller struct {
	log       logr.Logger
	client    kubernetes.Interface
	services  corelisters.ServiceLister
	endpoints corelisters.EndpointsLister
	// endpointsIndex is the Endpoints cache, for the keys of a new run.
	endpointsIndex cache.Indexer
	slices         discoverylisters.EndpointSliceLister
	tracker        *esutil.EndpointSliceTracker
	recorder       record.EventRecorder
	metrics        *kit.Metrics
	queue          *kit.Queue
	loop           *kit.Loop
	waiting        *kit.CacheWait
	max            int
	handlers       []cache.DoneChecker // done once each handler saw its first list
}

// New builds a Controller on src, adding its event handlers and
// registering its metrics (netplane_endpointslicemirroring_*) on reg.
func New(log logr.Logger, client kubernetes.Interface, src kit.Sources, recorder record.EventRecorder, reg prometheus.Registerer, opts Options) (*Controller, error) {
	c := &Controller{
		log:            log,
		services:       corelisters.NewServiceLister(src.Services.Indexer()),
		endpoints:      corelisters.NewEndpointsLister(src.Endpoints.Indexer()),
		endpointsIndex: src.Endpoints.Indexer(),
		slices:         discoverylisters.NewEndpointSliceLister(src.EndpointSlices.Indexer()),
		tracker:        esutil.NewEndpointSliceTracker(),
		recorder:       recorder,
		queue:          kit.NewQueue("endpointslicemirroring"),
		max:            int(opts.MaxEndpointsPerSubset),
	}
	m, err := kit.NewMetrics(reg, "endpointslicemirroring", kit.CountManaged(c.slices, ControllerName))
	if err != nil {
		return nil, err
	}
	c.metrics = m
	c.waiting = &kit.CacheWait{Queue: c.queue, Fresh: c.cacheFresh}
	c.loop = &kit.Loop{Queue: c.queue, Sync: c.sync, Metrics: m, Log: log, Waiting: c.waiting, Keys: c.keys}
	c.client = kit.CountWrites(client, m, nil, log)
	return c, c.addHandlers(src)
}

func (c *Controller) addHandlers(src kit.Sources) error {
	var errs []error
	add := func(s kit.Source, h cache.ResourceEventHandler) {
		reg, err := s.AddEventHandler(h)
		if err != nil {
			errs = append(errs, err)
			return
		}
		c.handlers = append(c.handlers, reg.HasSyncedChecker())
	}
	add(src.Endpoints, cache.ResourceEventHandlerFuncs{
		AddFunc:    c.enqueue,
		UpdateFunc: func(_, cur any) { c.enqueue(cur) },
		DeleteFunc: c.enqueue,
	})
	// Only a selector appearing or vanishing changes whether we mirror.
	add(src.Services, cache.ResourceEventHandlerFuncs{
		AddFunc: c.enqueue,
		UpdateFunc: func(old, cur any) {
			o, ok1 := old.(*corev1.Service)
			n, ok2 := cur.(*corev1.Service)
			if ok1 && ok2 && (o.Spec.Selector == nil) != (n.Spec.Selector == nil) {
				c.enqueue(cur)
			}
		},
		DeleteFunc: c.enqueue,
	})
	add(src.EndpointSlices, kit.SliceEvents(ControllerName, c.tracker, c.enqueueForSlice))
	add(src.EndpointSlices, c.waiting.Handler(ControllerName, endpointsKey))
	return errors.Join(errs...)
}

// Synced are done once every event handler has been handed its caches'
// first lists.
func (c *Controller) Synced() []cache.DoneChecker { return c.handlers }

// Run mirrors with workers goroutines until ctx ends, and returns once
// every sync in progress finished. It may run again once it returned (see
// kit.Loop).
func (c *Controller) Run(ctx context.Context, workers int) {
	c.log.Info("starting EndpointSlice mirroring controller", "workers", workers)
	c.loop.Run(ctx, workers)
}

// sync converges the mirrored slices of the Endpoints namespace/name.
func (c *Controller) sync(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return err
	}
	ep, err := c.endpoints.Endpoints(ns).Get(name)
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	mirror := err == nil && shouldMirror(ep)
	if mirror {
		svc, err := c.services.Services(ns).Get(name)
		if err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		mirror = err == nil && svc.Spec.Selector == nil
	}
	existing, err := c.mirrored(ns, name)
	if err != nil {
		return err
	}
	if !mirror {
		c.metrics.SetDesired(key, 0)
		return c.deleteAll(ctx, ns, name, existing, ep == nil)
	}
	if c.tracker.StaleSlices(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}, existing) {
		return kit.ErrStaleCache
	}
	p := Compute(ep, existing, c.max)
	c.report(ep, p)
	return c.apply(ctx, ep, p)
}

// shouldMirror is false for Endpoints that opt out and for the old
// Endpoints-based leader election records, which are not service backends.
func shouldMirror(ep *corev1.Endpoints) bool {
	if ep.Labels[discovery.LabelSkipMirror] == "true" {
		return false
	}
	_, isLock := ep.Annotations[resourcelock.LeaderElectionRecordAnnotationKey]
	return !isLock
}

func (c *Controller) report(ep *corev1.Endpoints, p Plan) {
	n := 0
	for _, s := range append(append([]*discovery.EndpointSlice{}, p.Create...), p.Update...) {
		n += len(s.Endpoints)
	}
	c.metrics.SetDesired(ep.Namespace+"/"+ep.Name, n)
	if p.Invalid > 0 {
		c.recorder.Eventf(ep, corev1.EventTypeWarning, "AddressNotMirrored",
			"Skipped %d addresses that are not valid IPs when mirroring to EndpointSlices; fix them in the Endpoints", p.Invalid)
	}
	if p.Skipped > 0 {
		c.recorder.Eventf(ep, corev1.EventTypeWarning, "TooManyAddressesToMirror",
			"A max of %d addresses can be mirrored to EndpointSlices per Endpoints subset. %d addresses were skipped", c.max, p.Skipped)
	}
}

func (c *Controller) apply(ctx context.Context, ep *corev1.Endpoints, p Plan) error {
	api := c.client.DiscoveryV1().EndpointSlices(ep.Namespace)
	if ep.DeletionTimestamp == nil {
		for _, s := range p.Create {
			got, err := api.Create(ctx, s, metav1.CreateOptions{})
			if apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
				return nil
			}
			if err != nil {
				return c.failed(ep, fmt.Errorf("creating a mirrored EndpointSlice: %w", err))
			}
			c.tracker.Update(got)
		}
	}
	for _, s := range p.Update {
		got, err := api.Update(ctx, s, metav1.UpdateOptions{})
		if err != nil {
			return c.failed(ep, fmt.Errorf("updating mirrored EndpointSlice %s: %w", s.Name, err))
		}
		c.tracker.Update(got)
	}
	for _, s := range p.Delete {
		if err := api.Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return c.failed(ep, fmt.Errorf("deleting mirrored EndpointSlice %s: %w", s.Name, err))
		}
		c.tracker.ExpectDeletion(s)
	}
	return nil
}

func (c *Controller) failed(ep *corev1.Endpoints, err error) error {
	c.recorder.Eventf(ep, corev1.EventTypeWarning, "FailedToUpdateEndpointSlices", "Error mirroring Endpoints to EndpointSlices: %v", err)
	return err
}

// deleteAll deletes the mirrored slices of ns/name. While the Endpoints
// exist (it opted out, or its Service has a selector again) each deletion
// is expected in the tracker: if it opts back in before the cache has seen
// the deletions, the sync finds those slices stale and waits for the cache,
// rather than taking them for mirrored slices that are still there. Once
// the Endpoints are gone, the tracker forgets the name.
func (c *Controller) deleteAll(ctx context.Context, ns, name string, existing []*discovery.EndpointSlice, gone bool) error {
	if gone {
		c.tracker.DeleteService(ns, name)
	}
	var errs []error
	for _, s := range existing {
		err := c.client.DiscoveryV1().EndpointSlices(ns).Delete(ctx, s.Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
			continue
		}
		if !gone {
			c.tracker.ExpectDeletion(s)
		}
	}
	return errors.Join(errs...)
}

func (c *Controller) mirrored(ns, name string) ([]*discovery.EndpointSlice, error) {
	return c.slices.EndpointSlices(ns).List(labels.Set{
		discovery.LabelServiceName: name,
		discovery.LabelManagedBy:   ControllerName,
	}.AsSelectorPreValidated())
}

func (c *Controller) enqueue(obj any) { kit.Enqueue(c.queue, obj) }

func (c *Controller) enqueueForSlice(s *discovery.EndpointSlice) {
	if key, ok := endpointsKey(s); ok {
		c.queue.Add(key)
	}
}

// keys are the keys of every Endpoints and of every slice we mirrored,
// whose Endpoints may be gone.
func (c *Controller) keys() []string {
	keys := c.endpointsIndex.ListKeys()
	slices, err := c.slices.List(labels.Set{discovery.LabelManagedBy: ControllerName}.AsSelectorPreValidated())
	if err != nil {
		return keys
	}
	for _, s := range slices {
		if key, ok := endpointsKey(s); ok {
			keys = append(keys, key)
		}
	}
	return keys
}

// endpointsKey is the Endpoints key a mirrored slice belongs to.
func endpointsKey(s *discovery.EndpointSlice) (string, bool) {
	name := s.Labels[discovery.LabelServiceName]
	return s.Namespace + "/" + name, name != ""
}

// cacheFresh reports whether the slice cache shows every write made for
// the Endpoints key.
func (c *Controller) cacheFresh(key string) bool {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return true
	}
	existing, err := c.mirrored(ns, name)
	return err != nil || !c.tracker.StaleSlices(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}, existing)
}
