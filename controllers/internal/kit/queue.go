// Package kit is what netplane's two EndpointSlice controllers (the selector
// one and the mirroring one) share in their shells, one file per noun: the
// retry queue (queue.go) and the worker pool on it (loop.go), the metrics
// (metrics.go), a client wrapper that counts the slice writes (client.go),
// slice event handlers and the wait for our own writes (sliceevents.go),
// the write budget (budget.go) and the views of the process's informers
// (views.go).
package kit

import (
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
