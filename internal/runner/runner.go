// Package runner is the one sync loop of netplane's level-triggered
// features (the proxier, the pod network, NetworkPolicy, the overlay, the
// DNS index): changes ask for a sync, and the runner decides when it runs.
//
// Its rules, the same for every loop and with kube-proxy's meaning of
// --min-sync-period and --sync-period:
//   - the first sync runs at once, and is full;
//   - a request runs a partial sync, at most one per MinInterval on
//     average, with bursts of Burst: a change after a quiet spell is
//     synced at once, and only a stream of changes is coalesced;
//   - a full sync runs every FullInterval, healing what others changed;
//   - a failed sync is retried as a full sync after RetryAfter;
//   - requests arriving during a sync run another sync after it.
package runner

import (
	"context"
	"fmt"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Options are a runner's intervals.
type Options struct {
	// MinInterval is the average spacing of syncs; 0 means none.
	MinInterval time.Duration
	// Burst is how many syncs may run back to back before MinInterval
	// spaces them; 0 means 2, kube-proxy's.
	Burst int
	// FullInterval is the period of full syncs; 0 means only the first
	// sync and retries are full.
	FullInterval time.Duration
	// RetryAfter is the wait before a failed sync is retried; 0 means 1s.
	RetryAfter time.Duration
}

// Runner runs one sync function by the package's rules.
type Runner struct {
	sync func(ctx context.Context, full bool) error
	opts Options
	kick chan struct{}

	mu           sync.Mutex
	pendingSince time.Time // oldest request not yet served; zero when none
	lastSuccess  time.Time
}

// New returns a runner of sync; full says whether a sync must compare the
// whole state rather than what changed since the last one.
func New(sync func(ctx context.Context, full bool) error, o Options) *Runner {
	if o.Burst <= 0 {
		o.Burst = 2
	}
	if o.RetryAfter <= 0 {
		o.RetryAfter = time.Second
	}
	return &Runner{sync: sync, opts: o, kick: make(chan struct{}, 1)}
}

// Request asks for a sync. It never blocks.
func (r *Runner) Request() {
	r.mu.Lock()
	if r.pendingSince.IsZero() {
		r.pendingSince = time.Now()
	}
	r.mu.Unlock()
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Run syncs until ctx ends.
func (r *Runner) Run(ctx context.Context) {
	limit := rate.NewLimiter(rate.Inf, 0)
	if r.opts.MinInterval > 0 {
		limit = rate.NewLimiter(rate.Every(r.opts.MinInterval), r.opts.Burst)
	}
	// due fires for the first sync, the next full sync and retries.
	due := time.NewTimer(0)
	defer due.Stop()
	full := true // until a full sync succeeds: at first and after a failure
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.kick:
		case <-due.C:
			full = true
		}
		if err := limit.Wait(ctx); err != nil {
			return
		}
		switch ok := r.once(ctx, full); {
		case !ok:
			full = true
			due.Reset(r.opts.RetryAfter)
		case full:
			full = false
			if r.opts.FullInterval > 0 {
				due.Reset(r.opts.FullInterval)
			}
		}
	}
}

// once runs one sync; a failure keeps its requests pending.
func (r *Runner) once(ctx context.Context, full bool) bool {
	r.mu.Lock()
	since := r.pendingSince
	r.pendingSince = time.Time{}
	r.mu.Unlock()
	err := r.sync(ctx, full)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		if !since.IsZero() && (r.pendingSince.IsZero() || since.Before(r.pendingSince)) {
			r.pendingSince = since
		}
		if r.pendingSince.IsZero() {
			r.pendingSince = time.Now()
		}
		return false
	}
	r.lastSuccess = time.Now()
	return true
}

// Healthy fails, as kube-proxy's health check does, when a request has
// waited longer than limit to be synced.
func (r *Runner) Healthy(limit time.Duration) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.pendingSince.IsZero() && time.Since(r.pendingSince) > limit {
		last := "never"
		if !r.lastSuccess.IsZero() {
			last = r.lastSuccess.Format(time.RFC3339)
		}
		return fmt.Errorf("a change has waited %v to be synced (limit %v); last successful sync %s",
			time.Since(r.pendingSince).Round(time.Second), limit, last)
	}
	return nil
}

// LastSuccess is when the last sync succeeded; zero before the first.
func (r *Runner) LastSuccess() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastSuccess
}
