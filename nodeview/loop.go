package nodeview

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/tools/cache"

	"github.com/netplane/netplane/internal/role"
	"github.com/netplane/netplane/internal/runner"
)

// Loop is the shell every node feature runs in: a feature is a sync
// function (read its views, compute the desired state, hand it to the
// kernel) and the loop owns the rest, the same for every feature:
//   - when a sync runs (internal/runner with --min-sync-period and
//     --sync-period; Request asks for one);
//   - /healthz: a change waiting longer than twice --sync-period;
//   - /readyz, under the feature's name: not ready until the views have
//     synced and a sync has converged, and while the last sync failed or
//     is waiting for something outside the node (Waiting);
//   - one log line per change of outcome, so that the same failure or
//     wait every period is said once;
//   - the node role's sync metrics, labelled by feature.
type Loop struct {
	d       role.Deps
	feature string
	sync    func(ctx context.Context, full bool) error
	runner  *runner.Runner
	metrics syncMetrics

	started func() // the end of its start (role.Deps.Started): the first sync that converged

	mu    sync.Mutex
	state error // readiness: nil once the last sync converged
}

// Waiting is what a sync returns when the node cannot converge yet for a
// reason outside it (its Node not registered, no pod CIDRs assigned): not
// a failure, which the runner would retry every second and /healthz would
// count, but the feature is not ready, and says why.
type Waiting string

func (w Waiting) Error() string { return string(w) }

var errNotSynced = errors.New("not synced yet")

// NewLoop makes feature's loop of sync and registers the sync metrics;
// call it when the process builds its roles.
func NewLoop(d role.Deps, feature string, sync func(ctx context.Context, full bool) error) (*Loop, error) {
	m, err := registerSyncMetrics(d.Metrics)
	if err != nil {
		return nil, err
	}
	l := &Loop{d: d, feature: feature, sync: sync, metrics: m, state: errNotSynced, started: d.Started.Begin()}
	n := d.Config.Node
	l.runner = runner.New(l.Sync, runner.Options{MinInterval: n.MinSyncPeriod.Duration, FullInterval: n.SyncPeriod.Duration})
	return l, nil
}

// Request asks for a sync; it never blocks.
func (l *Loop) Request() { l.runner.Request() }

// Run syncs until ctx ends, once the informer factory has started and
// every synced has: the first sync must see whole views, never a
// half-filled cache.
// A feature that waited for its caches itself passes none.
// Started beside a running agent (Deps.Takeover), the first sync also
// waits until that agent let go of the node: the node has one writer.
func (l *Loop) Run(ctx context.Context, synced ...cache.DoneChecker) {
	l.d.Checks.AddHealth(l.feature, l.Healthy)
	if len(synced) > 0 && !role.WaitForSync(ctx, l.d, l.feature, synced...) {
		if t := l.d.Takeover; t != nil {
			t.Leave()
		}
		return
	}
	if !Await(ctx, l.d) {
		return
	}
	l.d.Checks.AddReady(l.feature, l.ready)
	l.runner.Run(ctx)
}

// Await is Run's wait for a feature that runs no loop (one turned off,
// removing what it made): its writes wait until the node is this process's to write:
// started beside a running agent (Deps.Takeover), until that one let go.
// False when ctx ended first.
func Await(ctx context.Context, d role.Deps) bool {
	if t := d.Takeover; t != nil {
		return t.Wait(ctx)
	}
	return true
}

// LastSuccess is when a sync last ended without failing (a wait
// included); zero before the first.
func (l *Loop) LastSuccess() time.Time { return l.runner.LastSuccess() }

// Healthy fails, as kube-proxy's health check does, when a change has
// waited longer than twice --sync-period (a minute without one) to be
// synced.
func (l *Loop) Healthy() error {
	limit := time.Minute
	if p := l.d.Config.Node.SyncPeriod.Duration; p > 0 {
		limit = 2 * p
	}
	return l.runner.Healthy(limit)
}

func (l *Loop) ready() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state
}

// Sync is one sync as the runner runs it: the feature's, judged; for
// tests that drive a feature's syncs themselves.
func (l *Loop) Sync(ctx context.Context, full bool) error {
	start := time.Now()
	err := l.sync(ctx, full)
	l.report(err)
	var w Waiting
	switch {
	case errors.As(err, &w):
		return nil
	case err != nil:
		l.metrics.errors.WithLabelValues(l.feature).Inc()
		return err
	}
	kind := "partial"
	if full {
		kind = "full"
	}
	now := time.Now()
	l.metrics.duration.WithLabelValues(l.feature, kind).Observe(now.Sub(start).Seconds())
	l.metrics.last.WithLabelValues(l.feature).Set(float64(now.UnixNano()) / 1e9)
	return nil
}

// report keeps err as the readiness and logs it when the outcome changed.
func (l *Loop) report(err error) {
	l.mu.Lock()
	was := l.state
	l.state = err
	l.mu.Unlock()
	if err == nil {
		l.started()
	}
	if errString(err) == errString(was) {
		return
	}
	var w Waiting
	switch {
	case errors.As(err, &w):
		l.d.Log.Info(w.Error(), "feature", l.feature)
	case err != nil:
		l.d.Log.Error(err, "sync failed; retrying with a full sync", "feature", l.feature)
	default:
		l.d.Log.Info("converged", "feature", l.feature, "after", was.Error())
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// syncMetrics are the node role's sync metrics, one family for every
// feature; feature-specific figures stay with their feature.
type syncMetrics struct {
	duration *prometheus.HistogramVec
	errors   *prometheus.CounterVec
	last     *prometheus.GaugeVec
}

// registerSyncMetrics registers the family with r, or takes the one
// already there: every feature's loop shares it.
func registerSyncMetrics(r prometheus.Registerer) (syncMetrics, error) {
	m := syncMetrics{
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "netplane_node_sync_duration_seconds",
			Help:    "Time one sync of a node feature took (reading its views, computing and programming the kernel), by feature and type (full or partial).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 17),
		}, []string{"feature", "type"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "netplane_node_sync_errors_total",
			Help: "Syncs of a node feature that failed (retried as a full sync), by feature; the log says why.",
		}, []string{"feature"}),
		last: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "netplane_node_last_sync_timestamp_seconds",
			Help: "Unix time of the last sync of a node feature that left the kernel as planned, by feature.",
		}, []string{"feature"}),
	}
	var err error
	if m.duration, err = registerOnce(r, m.duration); err != nil {
		return m, err
	}
	if m.errors, err = registerOnce(r, m.errors); err != nil {
		return m, err
	}
	m.last, err = registerOnce(r, m.last)
	return m, err
}

// registerOnce registers c with r, or returns the collector of the same
// description already registered.
func registerOnce[C prometheus.Collector](r prometheus.Registerer, c C) (C, error) {
	if r == nil {
		return c, nil
	}
	err := r.Register(c)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	return c, err
}
