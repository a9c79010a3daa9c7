// Package kit is what netplane's two EndpointSlice controllers (the selector
// one and the mirroring one) share in their shells: the retry queue, the
// metrics, and a client wrapper that counts the slice writes they make.
package kit

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	typeddiscovery "k8s.io/client-go/kubernetes/typed/discovery/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	esutil "k8s.io/endpointslice/util"
)

// Retry tuning shared with kube-controller-manager's slice controllers: a
// 1 s base backoff (client-go's default is 5 ms) because one failing sync can
// mean many writes, and an overall 10 qps / 100 burst bound on retries.
const (
	SyncBackoff    = time.Second
	MaxSyncBackoff = 1000 * time.Second
	// MaxRetries is how often a failing key is retried before it is dropped
	// until its next event; after 15 rounds the backoff is at its cap anyway.
	MaxRetries = 15
)

// NewQueue returns the rate-limited work queue of a slice controller.
func NewQueue(name string) workqueue.TypedRateLimitingInterface[string] {
	return workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedMaxOfRateLimiter(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](SyncBackoff, MaxSyncBackoff),
			&workqueue.TypedBucketRateLimiter[string]{Limiter: rate.NewLimiter(rate.Limit(10), 100)},
		),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: name},
	)
}

// Enqueue adds the namespace/name key of an informer event's object to q;
// for a deleted object's tombstone, the key of the object it stands for.
func Enqueue(q workqueue.TypedRateLimitingInterface[string], obj any) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		utilruntime.HandleError(err)
		return
	}
	q.Add(key)
}

// ErrStaleCache means the slice cache does not yet show a write the
// controller made; acting on it would conflict with or undo that write, so
// the key is retried until the informer caught up.
var ErrStaleCache = errors.New("EndpointSlice informer cache is older than our last write; retrying")

// Metrics are one controller's Prometheus metrics, named
// netplane_<subsystem>_*.
type Metrics struct {
	syncs   *prometheus.CounterVec
	changes *prometheus.CounterVec

	mu      sync.Mutex
	desired map[string]int // per Service (or Endpoints) key
}

// NewMetrics registers the metrics of subsystem on reg. slices reports how
// many slices the controller manages right now (read at scrape time).
func NewMetrics(reg prometheus.Registerer, subsystem string, slices func() int) (*Metrics, error) {
	m := &Metrics{
		syncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "netplane", Subsystem: subsystem, Name: "syncs_total",
			Help: "Syncs by result: success, stale (cache behind our writes, retried) or error.",
		}, []string{"result"}),
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "netplane", Subsystem: subsystem, Name: "changes_total",
			Help: "EndpointSlice writes by operation: create, update, delete.",
		}, []string{"operation"}),
		desired: map[string]int{},
	}
	desired := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "netplane", Subsystem: subsystem, Name: "desired_endpoints",
		Help: "Endpoints the controller wants published, summed over all Services.",
	}, func() float64 { return float64(m.totalDesired()) })
	count := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "netplane", Subsystem: subsystem, Name: "slices",
		Help: "EndpointSlices this controller manages, as its cache sees them.",
	}, func() float64 { return float64(slices()) })
	for _, c := range []prometheus.Collector{m.syncs, m.changes, desired, count} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// ObserveSync counts one sync by its result.
func (m *Metrics) ObserveSync(err error) {
	result := "success"
	switch {
	case errors.Is(err, ErrStaleCache):
		result = "stale"
	case err != nil:
		result = "error"
	}
	m.syncs.WithLabelValues(result).Inc()
}

// SetDesired records how many endpoints key should have; 0 forgets it.
func (m *Metrics) SetDesired(key string, n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if n == 0 {
		delete(m.desired, key)
		return
	}
	m.desired[key] = n
}

func (m *Metrics) totalDesired() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	total := 0
	for _, n := range m.desired {
		total += n
	}
	return total
}

// CountWrites returns client with its EndpointSlice writes counted in m.
// With a budget, each create or update first tells it which Service key it
// writes for (namespace/service-name label), so that the write uses the
// reservation of that key's sync; see WriteBudget.
func CountWrites(client kubernetes.Interface, m *Metrics, budget *WriteBudget) kubernetes.Interface {
	return countingClient{Interface: client, m: m, budget: budget}
}

type countingClient struct {
	kubernetes.Interface
	m      *Metrics
	budget *WriteBudget
}

func (c countingClient) DiscoveryV1() typeddiscovery.DiscoveryV1Interface {
	return countingDiscovery{DiscoveryV1Interface: c.Interface.DiscoveryV1(), m: c.m, budget: c.budget}
}

type countingDiscovery struct {
	typeddiscovery.DiscoveryV1Interface
	m      *Metrics
	budget *WriteBudget
}

func (d countingDiscovery) EndpointSlices(ns string) typeddiscovery.EndpointSliceInterface {
	return countingSlices{EndpointSliceInterface: d.DiscoveryV1Interface.EndpointSlices(ns), m: d.m, budget: d.budget, ns: ns}
}

type countingSlices struct {
	typeddiscovery.EndpointSliceInterface
	m      *Metrics
	budget *WriteBudget
	ns     string
}

// writing passes the key es is written for to the budget. A delete names
// no Service; its sync's reservation ends when the sync does.
func (s countingSlices) writing(es *discoveryv1.EndpointSlice) {
	if s.budget != nil && es != nil {
		if svc, ok := es.Labels[discoveryv1.LabelServiceName]; ok {
			s.budget.Writing(s.ns + "/" + svc)
		}
	}
}

func (s countingSlices) count(op string, err error) {
	if err == nil {
		s.m.changes.WithLabelValues(op).Inc()
	}
}

func (s countingSlices) Create(ctx context.Context, es *discoveryv1.EndpointSlice, o metav1.CreateOptions) (*discoveryv1.EndpointSlice, error) {
	s.writing(es)
	out, err := s.EndpointSliceInterface.Create(ctx, es, o)
	s.count("create", err)
	return out, err
}

func (s countingSlices) Update(ctx context.Context, es *discoveryv1.EndpointSlice, o metav1.UpdateOptions) (*discoveryv1.EndpointSlice, error) {
	s.writing(es)
	out, err := s.EndpointSliceInterface.Update(ctx, es, o)
	s.count("update", err)
	return out, err
}

func (s countingSlices) Delete(ctx context.Context, name string, o metav1.DeleteOptions) error {
	err := s.EndpointSliceInterface.Delete(ctx, name, o)
	s.count("delete", err)
	return err
}

// echoSettle is how long an update of a slice we wrote, at a generation
// the tracker does not know, waits before it counts as someone else's: the
// informer can deliver our own write before the write's response records
// its generation in the tracker. In a churn of 400 flips that happened to
// 45% of the writes, and each cost a sync with nothing to write.
const echoSettle = 100 * time.Millisecond

// SliceEvents returns the EndpointSlice event handlers of a controller
// whose slices carry managed-by value manager. Only changes that are not
// the controller's own writes echoing back reach enqueue: the tracker knows
// the generation of every slice it wrote and every deletion it made. (A
// deletion's event can still beat the library's note of it, which costs a
// sync with nothing to write; updates are the frequent case handled here.)
func SliceEvents(manager string, tracker *esutil.EndpointSliceTracker, enqueue func(*discoveryv1.EndpointSlice)) cache.ResourceEventHandlerFuncs {
	managed := func(s *discoveryv1.EndpointSlice) bool { return s.Labels[discoveryv1.LabelManagedBy] == manager }
	// changed queues s unless it is our own write. A slice the tracker
	// holds may be one whose response is still on its way: look again
	// after echoSettle. A slice it does not hold (a create's echo, a
	// slice seen at start) is queued at once, as before the settle.
	changed := func(s *discoveryv1.EndpointSlice) {
		switch {
		case !tracker.ShouldSync(s):
		case !tracker.Has(s):
			enqueue(s)
		default:
			time.AfterFunc(echoSettle, func() {
				if tracker.ShouldSync(s) {
					enqueue(s)
				}
			})
		}
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if s, ok := obj.(*discoveryv1.EndpointSlice); ok && managed(s) {
				changed(s)
			}
		},
		UpdateFunc: func(oldObj, curObj any) {
			old, ok1 := oldObj.(*discoveryv1.EndpointSlice)
			cur, ok2 := curObj.(*discoveryv1.EndpointSlice)
			if !ok1 || !ok2 {
				return
			}
			// A label edit does not bump the generation: check it explicitly.
			if old.Labels[discoveryv1.LabelServiceName] != cur.Labels[discoveryv1.LabelServiceName] {
				enqueue(old)
				enqueue(cur)
				return
			}
			switch {
			case managed(old) != managed(cur):
				enqueue(cur)
			case managed(cur):
				changed(cur)
			}
		},
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			s, ok := obj.(*discoveryv1.EndpointSlice)
			// HandleDeletion is false for a deletion we did not make.
			if ok && managed(s) && tracker.Has(s) && !tracker.HandleDeletion(s) {
				enqueue(s)
			}
		},
	}
}

// CacheWait holds the keys whose last sync found the slice cache behind the
// controller's own writes. kube-controller-manager retries such a key with
// its failure backoff (1 s, then 2 s, ...); here the slice informer queues
// it again the moment it delivers a slice of that key and Fresh says the
// cache caught up. The backoff retry stays as the fallback for an event that
// never comes.
type CacheWait struct {
	Queue workqueue.TypedRateLimitingInterface[string]
	// Fresh reports whether the cache shows every write made for key.
	Fresh func(key string) bool

	mu   sync.Mutex
	keys map[string]struct{}
}

// Park records that key waits for the cache. If the cache caught up while
// the sync ran, key is queued at once (the queue holds a key being synced
// and hands it out again when that sync is done).
func (w *CacheWait) Park(key string) {
	w.mu.Lock()
	if w.keys == nil {
		w.keys = map[string]struct{}{}
	}
	w.keys[key] = struct{}{}
	w.mu.Unlock()
	w.Observe(key)
}

// Observe is called for every change the slice informer delivers for key;
// it queues a parked key whose cache caught up.
func (w *CacheWait) Observe(key string) {
	w.mu.Lock()
	_, parked := w.keys[key]
	w.mu.Unlock()
	if !parked || !w.Fresh(key) {
		return
	}
	w.mu.Lock()
	_, parked = w.keys[key]
	delete(w.keys, key)
	w.mu.Unlock()
	if parked {
		w.Queue.Add(key)
	}
}

// Handler returns slice event handlers that pass the key (from keyOf) of
// every slice managed by manager to Observe, our own writes included:
// those are what a parked key waits for.
func (w *CacheWait) Handler(manager string, keyOf func(*discoveryv1.EndpointSlice) (string, bool)) cache.ResourceEventHandlerFuncs {
	observe := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		s, ok := obj.(*discoveryv1.EndpointSlice)
		if !ok || s.Labels[discoveryv1.LabelManagedBy] != manager {
			return
		}
		if key, ok := keyOf(s); ok {
			w.Observe(key)
		}
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    observe,
		UpdateFunc: func(_, cur any) { observe(cur) },
		DeleteFunc: observe,
	}
}

// Loop is a controller's worker pool: it takes keys from Queue and passes
// them to Sync, retrying a failed key with backoff and dropping it after
// MaxRetries until its next event. A key whose sync returned ErrStaleCache
// is also parked in Waiting, when set. With a Budget, a worker reserves a
// write token before it takes a key (see WriteBudget).
type Loop struct {
	Queue   workqueue.TypedRateLimitingInterface[string]
	Sync    func(ctx context.Context, key string) error
	Metrics *Metrics
	Log     logr.Logger
	Waiting *CacheWait
	Budget  *WriteBudget

	inflight atomic.Int32
}

// Run runs workers until ctx ends, then shuts the queue down and returns
// once every sync in progress finished.
func (l *Loop) Run(ctx context.Context, workers int) {
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for l.next(ctx) {
			}
		})
	}
	<-ctx.Done()
	l.Queue.ShutDown()
	wg.Wait()
}

// Idle reports whether no key is queued or being synced; a key waiting
// out a delay (batching, backoff) does not count.
func (l *Loop) Idle() bool { return l.Queue.Len() == 0 && l.inflight.Load() == 0 }

func (l *Loop) next(ctx context.Context) bool {
	// release ends an unused reservation; it must run before Queue.Done,
	// which may hand the same key to another worker's reservation.
	release := func() {}
	if l.Budget != nil {
		res, err := l.Budget.Reserve(ctx)
		if err != nil {
			return false // stopping
		}
		release = res.Release
		defer release() // on the way out without a key; a no-op after the sync
		key, quit := l.Queue.Get()
		if quit {
			return false
		}
		res.For(key)
		return l.sync(ctx, key, release)
	}
	key, quit := l.Queue.Get()
	if quit {
		return false
	}
	return l.sync(ctx, key, release)
}

func (l *Loop) sync(ctx context.Context, key string, release func()) bool {
	l.inflight.Add(1)
	defer l.inflight.Add(-1)
	defer l.Queue.Done(key)
	err := l.Sync(ctx, key)
	release()
	l.Metrics.ObserveSync(err)
	if errors.Is(err, ErrStaleCache) && l.Waiting != nil {
		l.Waiting.Park(key)
	}
	switch {
	case err == nil:
		l.Queue.Forget(key)
	case l.Queue.NumRequeues(key) < MaxRetries:
		l.Log.V(2).Info("sync failed, retrying", "key", key, "err", err.Error())
		l.Queue.AddRateLimited(key)
	default:
		l.Log.Error(err, "sync failed too often, dropping the key until its next change", "key", key)
		l.Queue.Forget(key)
	}
	return true
}

// CountManaged returns a counter of the slices in lister whose managed-by
// label is manager, for the slices metric.
func CountManaged(lister discoverylisters.EndpointSliceLister, manager string) func() int {
	sel := labels.Set{discoveryv1.LabelManagedBy: manager}.AsSelectorPreValidated()
	return func() int {
		all, err := lister.List(sel)
		if err != nil {
			return 0
		}
		return len(all)
	}
}
