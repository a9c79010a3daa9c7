package outage

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// The numbers of docs/apiserver-outage.md: what the API server of a
// 5,000-node cluster sees from the node roles (6 informers each: Services,
// EndpointSlices, Nodes, Pods, Namespaces, NetworkPolicies) while it is
// away and once it is back, with client-go's reflector backoff and with
// the gate, simulated on a virtual clock.
const (
	simNodes     = 5000
	simInformers = 6
)

// simResult is one simulated outage: requests per second from its start,
// and each informer's catch-up (from the API server ready to its relist).
type simResult struct {
	perSecond []int
	catchUp   []time.Duration
}

func (r *simResult) request(at time.Duration) {
	s := int(at / time.Second)
	for len(r.perSecond) <= s {
		r.perSecond = append(r.perSecond, 0)
	}
	r.perSecond[s]++
}

// upstreamBackoff is a reflector's delay function as client-go v0.37 makes
// it: 0.8 s doubling to 30 s, each delay stretched by a random 0-100 %,
// back to 0.8 s when 2 minutes passed since the last such reset.
type upstreamBackoff struct {
	rng       *rand.Rand
	step      time.Duration
	lastReset time.Duration
}

func (b *upstreamBackoff) next(now time.Duration) time.Duration {
	if b.step == 0 || now-b.lastReset > 2*time.Minute {
		b.step, b.lastReset = 800*time.Millisecond, now
	}
	d := b.step
	b.step = min(2*b.step, 30*time.Second)
	return d + time.Duration(b.rng.Float64()*float64(d))
}

// simulateUpstream: every informer's watch breaks at 0 and is sent again
// at once, then after each backoff delay; the first one sent once the API
// server is back (at away) finds its version too old (410), and the
// reflector relists after one more delay (a list and a watch).
func simulateUpstream(away time.Duration, rng *rand.Rand) simResult {
	var r simResult
	for range simNodes * simInformers {
		b := &upstreamBackoff{rng: rng, lastReset: -time.Hour}
		t := time.Duration(0)
		r.request(t)
		for t < away {
			t += b.next(t)
			r.request(t)
		}
		t += b.next(t)
		r.request(t)
		r.request(t)
		r.catchUp = append(r.catchUp, t-away)
	}
	return r
}

// simulateGate: every informer's watch breaks at 0 and is sent again at
// once and refused; then each node sends only its probes until one finds
// the API server back, and its informers relist (a list and a watch) each
// at a random moment of the spread.
func simulateGate(p Policy, away time.Duration, rng *rand.Rand) simResult {
	var r simResult
	for range simNodes {
		for range simInformers {
			r.request(0)
		}
		t := time.Duration(0)
		for n := 0; ; n++ {
			t += p.ProbeDelay(n, rng.Float64())
			r.request(t)
			if t >= away {
				break
			}
		}
		for range simInformers {
			at := t + p.ReleaseDelay(rng.Float64())
			r.request(at)
			r.request(at)
			r.catchUp = append(r.catchUp, at-away)
		}
	}
	return r
}

// simSummary is what the docs quote of a simulated outage.
type simSummary struct {
	peakAway, lastSecondsAway, peakBack, total int
	p50, max                                   time.Duration
}

func summarize(r simResult, away time.Duration) simSummary {
	a := int(away / time.Second)
	var s simSummary
	for i, n := range r.perSecond {
		s.total += n
		switch {
		case i > 0 && i < a:
			s.peakAway = max(s.peakAway, n)
		case i >= a:
			s.peakBack = max(s.peakBack, n)
		}
	}
	s.lastSecondsAway = (r.perSecond[a-1] + r.perSecond[a-2] + r.perSecond[a-3]) / 3
	slices.Sort(r.catchUp)
	s.p50, s.max = r.catchUp[len(r.catchUp)/2], r.catchUp[len(r.catchUp)-1]
	return s
}

func TestFiveThousandNodesOutageRequestsAndCatchUp(t *testing.T) {
	var table strings.Builder
	fmt.Fprintf(&table, "%-8s %-9s %12s %15s %12s %10s %9s %9s\n", "outage", "policy", "peak away/s", "last 3 s away/s", "peak back/s", "requests", "p50", "max")
	for _, away := range []time.Duration{20 * time.Second, 40 * time.Second, 5 * time.Minute} {
		rng := rand.New(rand.NewPCG(1, uint64(away)))
		up := summarize(simulateUpstream(away, rng), away)
		gate := summarize(simulateGate(DefaultPolicy, away, rng), away)
		for _, row := range []struct {
			name string
			s    simSummary
		}{{"client-go", up}, {"gate", gate}} {
			fmt.Fprintf(&table, "%-8v %-9s %12d %15d %12d %10d %9v %9v\n", away, row.name, row.s.peakAway, row.s.lastSecondsAway,
				row.s.peakBack, row.s.total, row.s.p50.Round(100*time.Millisecond), row.s.max.Round(100*time.Millisecond))
		}
		if gate.max > DefaultPolicy.Bound() {
			t.Errorf("%v away: an informer caught up %v after the API server was back, beyond the bound %v", away, gate.max, DefaultPolicy.Bound())
		}
		if up.max < 10*time.Second {
			t.Errorf("%v away: client-go's backoff caught up within %v; the simulation is off", away, up.max)
		}
		if gate.peakAway >= up.peakAway {
			t.Errorf("%v away: the gate peaks at %d requests/s while the API server is away, client-go at %d", away, gate.peakAway, up.peakAway)
		}
	}
	t.Logf("%d nodes, %d informers each; requests per second of the outage:\n%s", simNodes, simInformers, table.String())
}
