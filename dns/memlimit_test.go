package dns

import (
	"math"
	"runtime"
	"runtime/debug"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestMemoryBoundFollowsTheSteadyStateAndItsGrowth(t *testing.T) {
	t.Cleanup(func() { debug.SetMemoryLimit(math.MaxInt64) })
	for _, gogc := range []int{50, 100} {
		prev := debug.SetGCPercent(gogc)
		m := &memoryBound{}
		runtime.GC()
		m.listed()
		r := readMemory()
		limit := debug.SetMemoryLimit(-1)
		// The limit leaves room for the garbage GOGC lets the heap grow
		// by, so that serving never runs the collector at the limit.
		if min := float64(r.live*uint64(100+gogc)/100+r.inUse-r.live) * relistBound; float64(limit) < min*0.9 {
			t.Errorf("GOGC %d: limit %d after a list, want about %.0f (%.2f × %d live grown by %d%%, plus %d of the runtime's own)",
				gogc, limit, min, relistBound, r.live, gogc, r.inUse-r.live)
		}
		grown := make([]byte, 4*limit) // an index or caches four times the size: more state, not a spike
		for i := range grown {
			grown[i] = 1
		}
		runtime.GC()
		m.grown()
		if now, want := debug.SetMemoryLimit(-1), float64(len(grown))*float64(100+gogc)/100*relistBound; float64(now) < want {
			t.Errorf("GOGC %d: limit %d after the live heap grew to more than %d, want at least %.0f", gogc, now, len(grown), want)
		}
		runtime.KeepAlive(grown)
		debug.SetGCPercent(prev)
	}
}

func TestARelistedUnchangedObjectIsNoChange(t *testing.T) {
	svc := func(rv string) *svcInfo { return &svcInfo{objMeta: objMeta{"a", "ns", rv}} }
	sl := func(rv string) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "a", ResourceVersion: rv}}
	}
	for _, tc := range []struct {
		name     string
		old, cur any
		same     bool
	}{
		{"a Service relisted", svc("7"), svc("7"), true},
		{"a Service changed", svc("7"), svc("8"), false},
		{"a slice relisted", sl("7"), sl("7"), true},
		{"a slice changed", sl("7"), sl("9"), false},
		{"records without versions", svc(""), svc(""), false},
	} {
		if got := sameVersion(tc.old, tc.cur); got != tc.same {
			t.Errorf("%s: same %v, want %v", tc.name, got, tc.same)
		}
	}
}
