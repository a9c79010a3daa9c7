// Package kit is what netplane's two EndpointSlice controllers (the selector
// one and the mirroring one) share in their shells, one file per noun: the
// retry queue (queue.go) and the worker pool on it (loop.go), the metrics
// (metrics.go), a client wrapper that counts the slice writes (client.go),
// slice event handlers and the wait for our own writes (sliceevents.go),
// the write budget (budget.go) and the views of the process's informers
// (views.go).
package kit

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
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

// Queue is a controller's work queue across its runs: a run (Loop.Run)
// takes the current work queue, and when the run ends Renew shuts that one
// down and puts a fresh one in its place. Keys added between two runs (the
// replica is not leading) wait in the fresh one, as the first run's keys
// waited for it; a shut-down work queue would drop them.
type Queue struct {
	build func() workqueue.TypedRateLimitingInterface[string]

	mu sync.RWMutex
	q  workqueue.TypedRateLimitingInterface[string]
}

// NewQueue returns the rate-limited queue of a slice controller.
func NewQueue(name string) *Queue {
	return NewQueueOf(func() workqueue.TypedRateLimitingInterface[string] {
		return workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedMaxOfRateLimiter(
				workqueue.NewTypedItemExponentialFailureRateLimiter[string](SyncBackoff, MaxSyncBackoff),
				&workqueue.TypedBucketRateLimiter[string]{Limiter: rate.NewLimiter(rate.Limit(10), 100)},
			),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: name},
		)
	})
}

// NewQueueOf returns a Queue whose work queues build makes.
func NewQueueOf(build func() workqueue.TypedRateLimitingInterface[string]) *Queue {
	return &Queue{build: build, q: build()}
}

// Current is the work queue the running (or next) run takes keys from.
func (q *Queue) Current() workqueue.TypedRateLimitingInterface[string] {
	q.mu.RLock()
	defer q.mu.RUnlock()
	return q.q
}

// Add queues key. The read lock keeps Renew from shutting the work queue
// down between the look-up and the add, which would drop the key.
func (q *Queue) Add(key string) {
	q.mu.RLock()
	defer q.mu.RUnlock()
	q.q.Add(key)
}

// AddAfter queues key once d passed.
func (q *Queue) AddAfter(key string, d time.Duration) {
	q.mu.RLock()
	defer q.mu.RUnlock()
	q.q.AddAfter(key, d)
}

// Len is the number of keys ready in the current work queue.
func (q *Queue) Len() int { return q.Current().Len() }

// Renew puts a fresh work queue in place and shuts the current one down.
// Keys still waiting out a delay or a backoff in the old one go down with
// it: the next run queues every key again (Loop.Keys).
func (q *Queue) Renew() {
	q.mu.Lock()
	old := q.q
	q.q = q.build()
	q.mu.Unlock()
	old.ShutDown()
}

// Enqueue adds the namespace/name key of an informer event's object to q;
// for a deleted object's tombstone, the key of the object it stands for.
func Enqueue(q *Queue, obj any) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		utilruntime.HandleError(err)
		return
	}
	q.Add(key)
}
