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
