package endpointslice

// What the benchmark measures besides the latencies: the contenders, their
// CPU time, the pod writes, percentiles and the API server's write counts.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/netplane/netplane/e2e/framework"
)

// contender is one controller the benchmark runs.
type contender struct {
	// describe tells its own view (sync results), logged after each phase.
	describe func() string
	stop     func()
	// trace is the log its trace lines go to (trace_test.go), if any.
	trace string
	proc  *framework.Process
}

// tailSummary describes (and forgets) which Services the flips recorded
// so far belong to, split into the big Service and the others, and how many
// of those at or above p99 are the big one's.
func (w *sliceWatch) tailSummary(p99 time.Duration) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var big, rest []time.Duration
	bigTail, tail := 0, 0
	for pod, d := range w.byPod {
		isBig := strings.HasPrefix(pod, "big-")
		if isBig {
			big = append(big, d)
		} else {
			rest = append(rest, d)
		}
		if d.Round(flipUnit) >= p99 {
			tail++
			if isBig {
				bigTail++
			}
		}
	}
	clear(w.byPod)
	return fmt.Sprintf("flips of Service big: %d, p50 %v p99 %v; of the others: p50 %v p99 %v; at or above p99: %d, %d of them big's",
		len(big), percentile(big, 50), percentile(big, 99), percentile(rest, 50), percentile(rest, 99), tail, bigTail)
}

// stallSummary describes (and forgets) the pod writes and slow flips
// recorded since start.
func (w *sliceWatch) stallSummary(start time.Time) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	pairs := seriesOfTwo(w.podWrites)
	out := fmt.Sprintf("pod writes p50 %v p99 %v max %v, two in series p50 %v p90 %v p99 %v", percentile(w.podWrites, 50), percentile(w.podWrites, 99),
		percentile(w.podWrites, 100), percentile(pairs, 50), percentile(pairs, 90), percentile(pairs, 99))
	if len(w.slowStarts) > 0 {
		first, last := slices.MinFunc(w.slowStarts, time.Time.Compare), slices.MaxFunc(w.slowStarts, time.Time.Compare)
		out += fmt.Sprintf("; the %d flips that took 1s or more were sent between %v and %v into the phase",
			len(w.slowStarts), first.Sub(start).Round(time.Second), last.Sub(start).Round(time.Second))
	}
	w.podWrites, w.slowStarts = nil, nil
	return out
}

// seriesOfTwo is what two of the writes d, one after the other, take:
// each write paired with 16 others drawn at random. A flip is two writes in
// series (the pod's, then the slice's), so its p99 is the floor of a
// flip's p99 on the API server of the run.
func seriesOfTwo(d []time.Duration) []time.Duration {
	if len(d) == 0 {
		return nil
	}
	r := rand.New(rand.NewPCG(1, 2))
	out := make([]time.Duration, 0, 16*len(d))
	for _, x := range d {
		for range 16 {
			out = append(out, x+d[r.IntN(len(d))])
		}
	}
	return out
}

func countAtLeast(d []time.Duration, floor time.Duration) int {
	n := 0
	for _, x := range d {
		if x >= floor {
			n++
		}
	}
	return n
}

func percentile(d []time.Duration, p int) time.Duration { return percentileTo(d, p, time.Millisecond) }

// flipUnit is what a churn's p50 and p99, and the ratios of them, are
// rounded to.
const flipUnit = 100 * time.Microsecond

// percentileTo is the p-th percentile of d rounded to unit.
func percentileTo(d []time.Duration, p int, unit time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return s[min(max(i-1, 0), len(s)-1)].Round(unit)
}

// writeCounts are EndpointSlice writes by "VERB code", as the API server
// counted them (apiserver_request_total), so that both contenders are
// counted the same and failed writes (409 conflicts) show.
type writeCounts map[string]int

func (w writeCounts) total() int {
	n := 0
	for _, v := range w {
		n += v
	}
	return n
}

func (w writeCounts) minus(before writeCounts) string {
	d := map[string]int{}
	for k, v := range w {
		if v -= before[k]; v != 0 {
			d[k] = v
		}
	}
	return formatCounts(d)
}

func sliceWrites(b *testing.B, s *framework.APIServer) writeCounts {
	raw, err := s.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	out := writeCounts{}
	for _, x := range parseSamples(string(raw), "apiserver_request_total") {
		verb := x.labels["verb"]
		if x.labels["resource"] != "endpointslices" || !slices.Contains([]string{"POST", "PUT", "PATCH", "DELETE"}, verb) {
			continue
		}
		out[verb+" "+x.labels["code"]] += int(x.value)
	}
	return out
}
