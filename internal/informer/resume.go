package informer

import (
	"context"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/netplane/netplane/internal/outage"
)

// resume is every informer's watch error handler, and from the first
// error on it runs the reflector itself. A reflector whose list or watch
// met an outage (outage.ErrUnavailable, from its lister-watcher) waits at
// the gate and, once the probe found the API server back and its share of
// the spread passed, lists and watches again at once, instead of returning
// to its backoff: after a long outage that backoff is 30–60 s, and
// client-go's shared informer takes no other (its reflector's Backoff
// option is not passed through). After another error, or a watch that
// just ended, it backs off as client-go does (0.8 s doubling to 30 s, full
// jitter, reset after 2 minutes), but a gate closing meanwhile cuts that
// short: the reflector then comes back with the others.
func resume(m *outage.Member) cache.WatchErrorHandlerWithContext {
	return func(ctx context.Context, r *cache.Reflector, err error) {
		b := wait.Backoff{Duration: 800 * time.Millisecond, Cap: 30 * time.Second, Steps: 38, Factor: 2, Jitter: 1}
		delay := b.DelayWithReset(clock.RealClock{}, 2*time.Minute)
		for ctx.Err() == nil {
			if outage.IsUnavailable(err) {
				if m.Wait(ctx) != nil {
					return
				}
			} else {
				if err != nil {
					cache.DefaultWatchErrorHandler(ctx, r, err)
				}
				if m.Sleep(ctx, delay()) != nil {
					return
				}
			}
			err = r.ListAndWatchWithContext(ctx)
		}
	}
}

// runReflector runs a lone reflector, which cannot be given a watch error
// handler, as a shared informer runs its own with resume.
func runReflector(ctx context.Context, r *cache.Reflector, m *outage.Member) {
	resume(m)(ctx, r, r.ListAndWatchWithContext(ctx))
}

// watchThrough passes w's events on, but takes an error event saying the
// API server or its etcd is away (which ends the watch) to the gate and
// drops it: the reflector then watches again through the gate, which
// sends nothing until the probe found it back, rather than relisting on
// its own backoff.
func watchThrough(m *outage.Member, w watch.Interface) watch.Interface {
	return watch.Filter(w, func(e watch.Event) (watch.Event, bool) {
		if e.Type != watch.Error {
			return e, true
		}
		if err := apierrors.FromObject(e.Object); outage.Unavailable(err) {
			m.Lost(err)
			return e, false
		}
		return e, true
	})
}
