package endpointslice

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// The benchmark's trace (NETPLANE_BENCH_TRACE=1): netplane logs at level 5
// when it sees a Pod change, starts a Service's sync and wrote a slice
// (with how long the write took); the benchmark knows when it sent each
// flip, when the pod write returned and when its watch showed the slice.
// Joined by pod and Service, they split each flip's latency in the steps
// between.

// flipTimes are one flip's moments as the benchmark saw them.
type flipTimes struct{ sent, written, shown time.Time }

// takeFlips returns (and forgets) the flips recorded so far.
func (w *sliceWatch) takeFlips() map[string]*flipTimes {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.flips
	w.flips = map[string]*flipTimes{}
	return out
}

// traceLine matches the trace lines of klog's text format, e.g.
// I1202 13:20:01.123456   42 controller.go:355] "Pod changed" logger="endpointslice" pod="bench/s1-2"
var traceLine = regexp.MustCompile(`^I(\d{4} \d\d:\d\d:\d\d\.\d{6})\s+\d+ \S+\] "(Pod changed|Syncing Service|Wrote EndpointSlice)" (.*)$`)

// traceLog is what netplane's trace lines say, by pod and by Service name
// (the benchmark's names are unique in its one namespace), in log order.
type traceLog struct {
	podEvents map[string][]time.Time
	syncs     map[string][]time.Time
	writes    map[string][]span
}

type span struct{ start, end time.Time }

func readTrace(path string) (traceLog, error) {
	t := traceLog{podEvents: map[string][]time.Time{}, syncs: map[string][]time.Time{}, writes: map[string][]span{}}
	f, err := os.Open(path)
	if err != nil {
		return t, err
	}
	defer f.Close()
	year := time.Now().Year()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := traceLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		at, err := time.ParseInLocation("0102 15:04:05.000000", m[1], time.Local)
		if err != nil {
			continue
		}
		at = at.AddDate(year-at.Year(), 0, 0)
		kv := traceValues(m[3])
		switch m[2] {
		case "Pod changed":
			pod := kv["pod"][strings.Index(kv["pod"], "/")+1:]
			t.podEvents[pod] = append(t.podEvents[pod], at)
		case "Syncing Service":
			svc := kv["service"][strings.Index(kv["service"], "/")+1:]
			t.syncs[svc] = append(t.syncs[svc], at)
		case "Wrote EndpointSlice":
			svc := kv["service"][strings.Index(kv["service"], "/")+1:]
			took, err := time.ParseDuration(kv["took"])
			if err != nil {
				continue
			}
			t.writes[svc] = append(t.writes[svc], span{at.Add(-took), at})
		}
	}
	return t, sc.Err()
}

var traceValue = regexp.MustCompile(`(\w+)=("[^"]*"|\S+)`)

func traceValues(s string) map[string]string {
	out := map[string]string{}
	for _, m := range traceValue.FindAllStringSubmatch(s, -1) {
		out[m[1]] = strings.Trim(m[2], `"`)
	}
	return out
}

// firstAfter is the first of ts (in order) at or after t.
func firstAfter(ts []time.Time, t time.Time) (time.Time, bool) {
	i := slices.IndexFunc(ts, func(x time.Time) bool { return !x.Before(t) })
	if i < 0 {
		return time.Time{}, false
	}
	return ts[i], true
}

// traceSteps are the steps of a flip, in order, as traceSummary names them.
var traceSteps = []string{"pod write", "to netplane's pod event", "to sync start", "planning", "slice write", "to the benchmark's watch"}

// flipSteps splits one flip of pod into traceSteps, and returns the floor
// (its two writes); ok is false when the trace misses a step.
func (t traceLog) flipSteps(pod string, f *flipTimes) (steps []time.Duration, floor time.Duration, ok bool) {
	svc := pod[:strings.LastIndex(pod, "-")]
	ev, ok1 := firstAfter(t.podEvents[pod], f.sent)
	sync, ok2 := firstAfter(t.syncs[svc], ev)
	i := slices.IndexFunc(t.writes[svc], func(s span) bool { return !s.start.Before(sync) })
	if !ok1 || !ok2 || i < 0 || f.shown.IsZero() || f.written.IsZero() {
		return nil, 0, false
	}
	w := t.writes[svc][i]
	steps = []time.Duration{f.written.Sub(f.sent), ev.Sub(f.sent), sync.Sub(ev), w.start.Sub(sync), w.end.Sub(w.start), f.shown.Sub(w.end)}
	return steps, steps[0] + steps[4], true
}

// traceSummary splits the flips' latencies by the trace at path: each
// step's p50 / p90 / p99 over all flips, and its mean over the flips at or
// above p99; and the floor, a flip's pod write plus its slice write.
func traceSummary(b *testing.B, path string, flips map[string]*flipTimes, p99 time.Duration) string {
	t, err := readTrace(path)
	if err != nil {
		b.Errorf("reading the trace: %v", err)
		return err.Error()
	}
	all := make([][]time.Duration, len(traceSteps))
	tail := make([]time.Duration, len(traceSteps))
	var floors []time.Duration
	traced, tailN := 0, 0
	for pod, f := range flips {
		steps, floor, ok := t.flipSteps(pod, f)
		if !ok {
			continue
		}
		traced++
		floors = append(floors, floor)
		atTail := f.shown.Sub(f.sent).Round(flipUnit) >= p99
		if atTail {
			tailN++
		}
		for i, d := range steps {
			all[i] = append(all[i], d)
			if atTail {
				tail[i] += d
			}
		}
	}
	var parts []string
	for i, name := range traceSteps {
		mean := time.Duration(0)
		if tailN > 0 {
			mean = (tail[i] / time.Duration(tailN)).Round(100 * time.Microsecond)
		}
		parts = append(parts, fmt.Sprintf("%s %v / %v / %v (tail %v)", name,
			pct(all[i], 50), pct(all[i], 90), pct(all[i], 99), mean))
	}
	return fmt.Sprintf("%d of %d flips traced, %d at or above p99; p50 / p90 / p99 (tail mean) of: %s; floor (pod write + slice write) p50 %v p90 %v p99 %v",
		traced, len(flips), tailN, strings.Join(parts, ", "), pct(floors, 50), pct(floors, 90), pct(floors, 99))
}

// pct is a percentile fine enough for steps well under a millisecond.
func pct(d []time.Duration, p int) time.Duration { return percentileTo(d, p, 100*time.Microsecond) }

// TestTraceSplitsAFlip: the trace lines of klog's text format, among other
// lines, split a flip into its steps; a flip whose Service has no sync
// after the pod change is not traced.
func TestTraceSplitsAFlip(t *testing.T) {
	log := `I1202 13:20:00.000000   42 reflector.go:1] "Caches populated" type="*v1.Pod"
I1202 13:20:00.500000   42 controller.go:1] "Pod changed" logger="endpointslice" pod="bench/s1-7"
I1202 13:20:01.006000   42 controller.go:1] "Pod changed" logger="endpointslice" pod="bench/s1-7"
I1202 13:20:01.006500   42 controller.go:2] "Syncing Service" logger="endpointslice" service="bench/s1"
I1202 13:20:01.015000   42 client.go:3] "Wrote EndpointSlice" logger="endpointslice" operation="update" service="bench/s1" took="8ms" err=null
I1202 13:20:01.006000   42 controller.go:1] "Pod changed" logger="endpointslice" pod="bench/big-3"
`
	path := filepath.Join(t.TempDir(), "netplane.log")
	if err := os.WriteFile(path, []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	tr, err := readTrace(path)
	if err != nil {
		t.Fatal(err)
	}
	at := func(s string) time.Time {
		x, err := time.ParseInLocation("0102 15:04:05.000000", s, time.Local)
		if err != nil {
			t.Fatal(err)
		}
		return x.AddDate(time.Now().Year()-x.Year(), 0, 0)
	}
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	for _, tc := range []struct {
		pod       string
		f         flipTimes
		want      []time.Duration
		wantFloor time.Duration
		ok        bool
	}{
		{"s1-7", flipTimes{at("1202 13:20:01.000000"), at("1202 13:20:01.007000"), at("1202 13:20:01.015500")},
			[]time.Duration{ms(7), ms(6), ms(0.5), ms(0.5), ms(8), ms(0.5)}, ms(15), true},
		{"big-3", flipTimes{at("1202 13:20:01.000000"), at("1202 13:20:01.007000"), at("1202 13:20:01.020000")}, nil, 0, false},
	} {
		steps, floor, ok := tr.flipSteps(tc.pod, &tc.f)
		if ok != tc.ok || !slices.Equal(steps, tc.want) || floor != tc.wantFloor {
			t.Errorf("%s: got %v, floor %v, %v; want %v, floor %v, %v", tc.pod, steps, floor, ok, tc.want, tc.wantFloor, tc.ok)
		}
	}
}
