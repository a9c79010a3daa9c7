package outage

import (
	"context"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func value(c prometheus.Metric) float64 {
	m := &dto.Metric{}
	_ = c.Write(m)
	if m.Histogram != nil {
		return m.Histogram.GetSampleSum()
	}
	return m.Counter.GetValue()
}

// signalClock hands the test every timer the gate starts; the test moves
// time by firing it.
type signalClock struct {
	now    time.Time
	timers chan timer
}

type timer struct {
	d    time.Duration
	fire chan time.Time
}

func (c *signalClock) Now() time.Time                  { return c.now }
func (c *signalClock) Since(t time.Time) time.Duration { return c.now.Sub(t) }
func (c *signalClock) After(d time.Duration) <-chan time.Time {
	ch := make(chan time.Time, 1)
	c.timers <- timer{d, ch}
	return ch
}

// next waits for the gate's next timer, checks its length, and fires it.
func (c *signalClock) next(t *testing.T, want time.Duration) {
	t.Helper()
	select {
	case tm := <-c.timers:
		if tm.d != want {
			t.Fatalf("timer of %v, want %v", tm.d, want)
		}
		c.now = c.now.Add(tm.d)
		tm.fire <- c.now
	case <-time.After(10 * time.Second):
		t.Fatalf("no timer of %v started", want)
	}
}

var refused = &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}

// An outage as a process lives it: two informers meet it, the probe backs
// off while the API server is away, both wait at the gate without a
// request, come back spread once a probe succeeds, and one line is logged.
func TestGateProbesOnceForAllInformersAndReleasesThemSpread(t *testing.T) {
	for _, c := range []struct {
		name       string
		probes     []error         // each probe's answer; the last is nil
		probeWaits []time.Duration // the wait before each
	}{
		{"back at the first probe", []error{nil}, []time.Duration{250 * time.Millisecond}},
		{"away for four probes", []error{refused, refused, refused, refused, nil},
			[]time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 2 * time.Second}},
	} {
		t.Run(c.name, func(t *testing.T) {
			clk := &signalClock{now: time.Date(2026, 11, 28, 3, 0, 0, 0, time.UTC), timers: make(chan timer)}
			answers := make(chan error, len(c.probes))
			for _, e := range c.probes {
				answers <- e
			}
			var lines []string
			log := funcr.New(func(prefix, args string) { lines = append(lines, args) }, funcr.Options{})
			g := newGate(DefaultPolicy, func(context.Context) error { return <-answers }, clk, func() float64 { return 0.5 }, log)
			ctx := context.Background()
			a, b := g.Member(ctx, "test"), g.Member(ctx, "test")

			calls := 0
			call := func(err error) func() error { return func() error { calls++; return err } }
			if err := a.Do(ctx, call(refused)); !IsUnavailable(err) {
				t.Fatalf("a refused list = %v, want unavailable", err)
			}
			if err := b.Do(ctx, call(nil)); !IsUnavailable(err) || calls != 1 {
				t.Fatalf("b's list while the gate is closed: %v after %d requests, want unavailable after 1", err, calls)
			}
			waited := make(chan *Member, 2)
			for _, m := range []*Member{a, b} {
				go func() {
					if err := m.Wait(ctx); err == nil {
						waited <- m
					}
				}()
			}
			for _, w := range c.probeWaits {
				clk.next(t, w)
			}
			clk.next(t, 500*time.Millisecond) // each one's share of the 1 s spread
			clk.next(t, 500*time.Millisecond)
			for range 2 {
				m := <-waited
				if err := m.Do(ctx, call(nil)); err != nil {
					t.Fatalf("relist after the probe succeeded: %v", err)
				}
			}
			if calls != 3 {
				t.Errorf("%d requests, want 3: one refused, two relists", calls)
			}
			if got := value(g.outages); got != 1 {
				t.Errorf("outages_total = %v, want 1", got)
			}
			if got, want := value(g.probes), float64(len(c.probes)); got != want {
				t.Errorf("probes_total = %v, want %v", got, want)
			}
			if len(lines) != 1 || !strings.Contains(lines[0], `"caughtUp"="1s"`) || !strings.Contains(lines[0], "connection refused") {
				t.Errorf("log lines %q, want one saying it caught up in 1s after a refused connection", lines)
			}
			if a.Closed() || b.Closed() {
				t.Error("the gate is still closed after the outage ended")
			}
		})
	}
}

// A probe answering while the API server still refuses requests (its
// watch cache initialising) is not the end: the member failing again
// closes the gate, the probe resumes from its backoff, and the outage is
// logged once, when every member is back.
func TestGateLostAgainAfterProbeGoesOnAsOneOutage(t *testing.T) {
	clk := &signalClock{now: time.Date(2026, 11, 28, 3, 0, 0, 0, time.UTC), timers: make(chan timer)}
	answers := make(chan error, 3)
	answers <- refused
	answers <- nil
	answers <- nil
	lines := 0
	log := funcr.New(func(string, string) { lines++ }, funcr.Options{})
	g := newGate(DefaultPolicy, func(context.Context) error { return <-answers }, clk, func() float64 { return 0 }, log)
	ctx := context.Background()
	m := g.Member(ctx, "test")
	_ = m.Do(ctx, func() error { return refused })
	done := make(chan error)
	go func() { done <- m.Wait(ctx) }()
	clk.next(t, 187500*time.Microsecond) // 250 ms at 75 %
	clk.next(t, 375*time.Millisecond)
	clk.next(t, 0) // no share of the spread at u=0
	<-done
	if err := m.Do(ctx, func() error { return syscall.ECONNRESET }); !IsUnavailable(err) {
		t.Fatalf("relist refused again = %v, want unavailable", err)
	}
	go func() { done <- m.Wait(ctx) }()
	clk.next(t, 750*time.Millisecond) // the third probe's wait: the backoff went on
	clk.next(t, 0)
	<-done
	if err := m.Do(ctx, func() error { return nil }); err != nil {
		t.Fatal(err)
	}
	if got := value(g.catchUp); got != 0.75 {
		t.Errorf("catch-up took %vs, want 0.75: from the second probe's success", got)
	}
	if got := value(g.outages); got != 1 || lines != 1 {
		t.Errorf("%v outages counted and %d lines logged, want 1 and 1", got, lines)
	}
}

// A member backing off after a watch that just ended (client-go's delay
// of up to 60 s) is cut short when the gate closes: it comes back with the
// others once the probe answers, not when its delay ends.
func TestSleepGivesWayToTheGateClosing(t *testing.T) {
	clk := &signalClock{now: time.Date(2026, 11, 28, 3, 0, 0, 0, time.UTC), timers: make(chan timer)}
	g := newGate(DefaultPolicy, func(context.Context) error { return nil }, clk, func() float64 { return 0.5 }, logr.Discard())
	ctx := context.Background()
	sleeper, other := g.Member(ctx, "test"), g.Member(ctx, "test")
	woke := make(chan error)
	go func() { woke <- sleeper.Sleep(ctx, 45*time.Second) }()
	long := <-clk.timers // the 45 s backoff, never fired
	if long.d != 45*time.Second {
		t.Fatalf("backoff timer of %v, want 45s", long.d)
	}
	_ = other.Do(ctx, func() error { return refused })
	clk.next(t, 250*time.Millisecond) // the probe's wait; it answers
	clk.next(t, 500*time.Millisecond) // the sleeper's share of the spread
	if err := <-woke; err != nil {
		t.Fatal(err)
	}
	if err := sleeper.Do(ctx, func() error { return nil }); err != nil {
		t.Fatal(err)
	}
}

// A member that leaves (its resource's CRD deleted) while an outage waits
// for it is no longer waited for: the outage ends when the others are
// back, and the next one is an outage of its own.
func TestAMemberLeavingIsNotWaitedFor(t *testing.T) {
	clk := &signalClock{now: time.Date(2026, 11, 28, 3, 0, 0, 0, time.UTC), timers: make(chan timer)}
	lines := 0
	log := funcr.New(func(string, string) { lines++ }, funcr.Options{})
	g := newGate(DefaultPolicy, func(context.Context) error { return nil }, clk, func() float64 { return 0 }, log)
	ctx := context.Background()
	stays, leaves := g.Member(ctx, "nodes"), g.Member(ctx, "clusternetworkpolicies")
	_ = stays.Do(ctx, func() error { return refused })
	_ = leaves.Do(ctx, func() error { return nil }) // closed: it meets the outage too
	done := make(chan error)
	go func() { done <- stays.Wait(ctx) }()
	clk.next(t, 187500*time.Microsecond) // the probe answers
	clk.next(t, 0)                       // stays' share of the spread
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	_ = stays.Do(ctx, func() error { return nil })
	leaves.Leave()
	if lines != 1 || g.closed() || g.cur != nil {
		t.Errorf("%d lines logged, outage still on: %v; want the outage over, logged once", lines, g.cur != nil)
	}
}
