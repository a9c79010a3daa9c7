package outage

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
)

// Gate is a process's one view of whether its API server is there. Each
// informer holds a Member. An outage lasts from the first member's failed
// request to the last waiting member's successful relist; one line is
// logged at its end.
type Gate struct {
	policy Policy
	probe  func(context.Context) error
	clock  timers
	rand   func() float64
	log    logr.Logger

	outages, probes prometheus.Counter
	catchUp         prometheus.Histogram

	mu      sync.Mutex
	cur     *episode      // nil between outages
	closing chan struct{} // closed (and replaced) whenever the gate closes
}

// episode is one outage.
type episode struct {
	lostAt, readyAt time.Time
	cause           error
	back            chan struct{} // closed when a probe succeeds; a new one if lost again
	probing         bool
	probes          int    // failed so far: the probe backoff's step
	waiting         int    // members that met it and have not relisted yet
	last            string // the member whose return ended it
}

// New returns a gate probing with probe (Readyz) on the real clock.
func New(p Policy, probe func(context.Context) error, log logr.Logger) *Gate {
	return newGate(p, probe, clock.RealClock{}, rand.Float64, log)
}

// timers is what the gate needs of a clock; its tests fire each timer.
type timers interface {
	Now() time.Time
	Since(time.Time) time.Duration
	After(time.Duration) <-chan time.Time
}

func newGate(p Policy, probe func(context.Context) error, c timers, r func() float64, log logr.Logger) *Gate {
	return &Gate{
		policy: p, probe: probe, clock: c, rand: r, log: log, closing: make(chan struct{}),
		outages: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "netplane_apiserver_outages_total",
			Help: "Times the API server was found away (a list or watch refused, cut, timed out, 5xx or 429).",
		}),
		probes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "netplane_apiserver_probes_total",
			Help: "Readiness probes (GET /readyz) sent while the API server was away.",
		}),
		catchUp: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "netplane_apiserver_catch_up_seconds",
			Help:    "From the readiness probe finding the API server back to the last informer that met the outage having relisted.",
			Buckets: []float64{0.1, 0.25, 0.5, 1, 2, 3, 4, 5, 7.5, 10, 20},
		}),
	}
}

// Readyz probes the API server behind c with GET /readyz, which fails
// while its etcd is away too. A nil client (a fake clientset's) is always
// ready.
func Readyz(c rest.Interface) func(context.Context) error {
	return func(ctx context.Context) error {
		if c == nil {
			return nil
		}
		return c.Get().AbsPath("/readyz").Do(ctx).Error()
	}
}

// Register adds the gate's metrics to reg.
func (g *Gate) Register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{g.outages, g.probes, g.catchUp} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// Member is one informer's place at the gate.
type Member struct {
	g    *Gate
	ctx  context.Context // the informer's life, which bounds the probes it starts
	name string          // what it lists, for the log
	out  bool            // met the current outage and not relisted yet; under g.mu
}

// Member adds an informer of name running until ctx ends.
func (g *Gate) Member(ctx context.Context, name string) *Member {
	return &Member{g: g, ctx: ctx, name: name}
}

// closed reports whether an outage is on and no probe found the API
// server back yet.
func (g *Gate) closed() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.cur != nil && !isClosed(g.cur.back)
}

// Away reports whether an outage is on: from the first failed request to
// the last waiting member's relist.
func (g *Gate) Away() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.cur != nil
}

// Closed reports whether the member should not send a request now: an
// outage is on and no probe has found the API server back yet.
func (m *Member) Closed() bool { return m.g.closed() }

// Lost tells the gate the member's request failed with err, which
// Unavailable: an outage begins (or one found over too soon goes on) and
// a probe runs until the API server answers or the member's life ends.
func (m *Member) Lost(err error) {
	g := m.g
	g.mu.Lock()
	defer g.mu.Unlock()
	e := g.lose(m.ctx, err)
	if !m.out {
		m.out = true
		e.waiting++
	}
}

// lose begins an outage or goes on with the current one, and has a probe
// run until ctx ends or the API server answers. Under g.mu.
func (g *Gate) lose(ctx context.Context, err error) *episode {
	e := g.cur
	switch {
	case e == nil:
		e = &episode{lostAt: g.clock.Now(), cause: err, back: make(chan struct{})}
		g.cur = e
		g.outages.Inc()
	case isClosed(e.back):
		// The probe answered, yet requests fail: back off further.
		e.back = make(chan struct{})
		e.probes++
	default:
		return e // closed already
	}
	close(g.closing)
	g.closing = make(chan struct{})
	if !e.probing {
		e.probing = true
		go g.probeUntilBack(ctx, e, e.back)
	}
	return e
}

// Wait blocks while the gate is closed, then for the member's share of the
// spread. It returns ctx's error if ctx ends first.
func (m *Member) Wait(ctx context.Context) error {
	var back chan struct{}
	m.g.mu.Lock()
	if e := m.g.cur; e != nil {
		back = e.back
	}
	m.g.mu.Unlock()
	if back == nil {
		return ctx.Err()
	}
	select {
	case <-back:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-m.g.clock.After(m.g.policy.ReleaseDelay(m.g.rand())):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Sleep waits d, as a reflector backs off between lists, unless the gate
// closes meanwhile: the member then waits at the gate with the others
// (Wait) rather than sleeping on past the API server's return.
func (m *Member) Sleep(ctx context.Context, d time.Duration) error {
	g := m.g
	g.mu.Lock()
	closing, closed := g.closing, g.cur != nil && !isClosed(g.cur.back)
	g.mu.Unlock()
	if !closed {
		select {
		case <-g.clock.After(d):
			return nil
		case <-closing: // maybe open again by now: Wait then only spreads
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	m.join()
	return m.Wait(ctx)
}

// join counts the member among those the current outage waits for.
func (m *Member) join() {
	m.g.mu.Lock()
	defer m.g.mu.Unlock()
	if e := m.g.cur; e != nil && !m.out {
		m.out = true
		e.waiting++
	}
}

// Do sends a request through the gate: none while it is closed (the
// member then waits with the others), and one that fails Unavailable
// closes it. Either way the error is then ErrUnavailable's.
func (m *Member) Do(ctx context.Context, call func() error) error {
	if m.Closed() {
		m.Lost(errGateClosed)
		return ErrUnavailable(errGateClosed)
	}
	err := call()
	switch {
	case err == nil:
		m.Back()
	case IsUnavailable(err): // from the transport: closed, or the connection failed
		m.Lost(err)
	case Unavailable(err) && ctx.Err() == nil:
		m.Lost(err)
		return ErrUnavailable(err)
	}
	return err
}

// Back tells the gate the member's request succeeded: the last member of
// an outage to come back ends it.
func (m *Member) Back() { m.release(true) }

// Leave tells the gate the member stopped for good (its informer's life
// ended: a resource whose CRD went away): the outage it met no longer
// waits for it, so the outage ends with the members still running.
func (m *Member) Leave() { m.release(false) }

// release counts the member out of the outage it met, if any, and ends
// the outage when it was the last one waited for; back: it came back
// (named in the outage's line) rather than left.
func (m *Member) release(back bool) {
	g := m.g
	g.mu.Lock()
	defer g.mu.Unlock()
	if !m.out {
		return
	}
	m.out = false
	e := g.cur
	e.waiting--
	if back {
		e.last = m.name
	}
	if e.waiting == 0 && isClosed(e.back) {
		g.finish(e)
	}
}

// finish ends the outage: every member that met it is back. Under g.mu.
func (g *Gate) finish(e *episode) {
	g.cur = nil
	took := g.clock.Since(e.readyAt)
	g.catchUp.Observe(took.Seconds())
	g.log.Info("API server outage over", "lost", e.lostAt.UTC().Format(time.RFC3339Nano),
		"away", e.readyAt.Sub(e.lostAt).Round(time.Millisecond), "caughtUp", took.Round(time.Millisecond),
		"failedProbes", e.probes, "lastBack", e.last, "cause", e.cause.Error())
}

// probeUntilBack probes on the policy's backoff until a probe succeeds,
// then opens back.
func (g *Gate) probeUntilBack(ctx context.Context, e *episode, back chan struct{}) {
	for {
		g.mu.Lock()
		wait := g.policy.ProbeDelay(e.probes, g.rand())
		g.mu.Unlock()
		select {
		case <-g.clock.After(wait):
		case <-ctx.Done():
			g.mu.Lock()
			e.probing = false
			g.mu.Unlock()
			return
		}
		pctx, cancel := context.WithTimeout(ctx, g.policy.ProbeTimeout)
		err := g.probe(pctx)
		cancel()
		g.probes.Inc()
		g.mu.Lock()
		if err == nil {
			if e.readyAt.IsZero() { // catching up began at the first answer
				e.readyAt = g.clock.Now()
			}
			e.probing = false
			close(back)
			if e.waiting == 0 { // no informer's request met it but the transport's
				g.finish(e)
			}
			g.mu.Unlock()
			return
		}
		e.probes++
		stop := ctx.Err() != nil
		e.probing = !stop
		g.mu.Unlock()
		if stop {
			return
		}
	}
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// unavailable is what a member's failed request becomes: it names the
// cause without wrapping it, so a reflector does not take it for a refused
// connection it would retry on its own backoff.
type unavailable struct{ cause string }

func (u *unavailable) Error() string { return "API server unavailable: " + u.cause }

// ErrUnavailable wraps a request's error into one IsUnavailable knows.
func ErrUnavailable(cause error) error { return &unavailable{cause: cause.Error()} }

// IsUnavailable reports whether err (or one it wraps) came from
// ErrUnavailable.
func IsUnavailable(err error) bool {
	var u *unavailable
	return errors.As(err, &u)
}
