package kit

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/go-logr/logr"
	"k8s.io/client-go/util/workqueue"
)

// ErrStaleCache means the slice cache does not yet show a write the
// controller made; acting on it would conflict with or undo that write, so
// the key is retried until the informer caught up.
var ErrStaleCache = errors.New("EndpointSlice informer cache is older than our last write; retrying")

// Loop is a controller's worker pool: it takes keys from Queue and passes
// them to Sync, retrying a failed key with backoff and dropping it after
// MaxRetries until its next event. A key whose sync returned ErrStaleCache
// is also parked in Waiting, when set. With a Budget, a worker reserves a
// write token before it takes a key (see WriteBudget). A Loop can run
// again after a run ended (a replica that lost its Lease and won it back),
// one run at a time.
type Loop struct {
	Queue   *Queue
	Sync    func(ctx context.Context, key string) error
	Metrics *Metrics
	Log     logr.Logger
	Waiting *CacheWait
	Budget  *WriteBudget
	// Keys lists every key the controller is responsible for. A run after
	// the first queues them all: the keys that waited out a delay or a
	// backoff when the last run ended went down with its work queue, and
	// no event may come for them again.
	Keys func() []string

	runs     atomic.Int32
	inflight atomic.Int32
}

// Run runs workers until ctx ends, then puts a fresh work queue in place
// for the next run and returns once every sync in progress finished. A key
// taken after ctx ended is not synced: it moves to the fresh work queue,
// so that a replica that stopped leading writes nothing more.
func (l *Loop) Run(ctx context.Context, workers int) {
	if l.runs.Add(1) > 1 && l.Keys != nil {
		for _, key := range l.Keys() {
			l.Queue.Add(key)
		}
	}
	q := l.Queue.Current()
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for l.next(ctx, q) {
			}
		})
	}
	<-ctx.Done()
	l.Queue.Renew()
	wg.Wait()
	// Workers under a budget stop without taking what is left: it waits
	// for the next run too.
	for q.Len() > 0 {
		key, _ := q.Get()
		q.Done(key)
		l.Queue.Add(key)
	}
}

// Idle reports whether no key is queued or being synced; a key waiting
// out a delay (batching, backoff) does not count.
func (l *Loop) Idle() bool { return l.Queue.Len() == 0 && l.inflight.Load() == 0 }

func (l *Loop) next(ctx context.Context, q workqueue.TypedRateLimitingInterface[string]) bool {
	// release ends an unused reservation; it must run before q.Done,
	// which may hand the same key to another worker's reservation.
	release := func() {}
	var res *Reservation
	if l.Budget != nil {
		var err error
		res, err = l.Budget.Reserve(ctx)
		if err != nil {
			return false // stopping
		}
		release = res.Release
		defer release() // on the way out without a key; a no-op after the sync
	}
	key, quit := q.Get()
	if quit {
		return false
	}
	if ctx.Err() != nil {
		q.Done(key)
		l.Queue.Add(key)
		return true
	}
	if res != nil {
		res.For(key)
	}
	return l.sync(ctx, q, key, release)
}
func (l *Loop) sync(ctx context.Context, q workqueue.TypedRateLimitingInterface[string], key string, release func()) bool {
	l.inflight.Add(1)
	defer l.inflight.Add(-1)
	defer q.Done(key)
	err := l.Sync(ctx, key)
	release()
	l.Metrics.ObserveSync(err)
	if errors.Is(err, ErrStaleCache) && l.Waiting != nil {
		l.Waiting.Park(key)
	}
	switch {
	case err == nil:
		q.Forget(key)
	case q.NumRequeues(key) < MaxRetries:
		l.Log.V(2).Info("sync failed, retrying", "key", key, "err", err.Error())
		q.AddRateLimited(key)
	default:
		l.Log.Error(err, "sync failed too often, dropping the key until its next change", "key", key)
		q.Forget(key)
	}
	return true
}
