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
	m := &memoryBound{}
	runtime.GC()
	m.listed()
	inUse, _ := readMemory()
	limit := debug.SetMemoryLimit(-1)
	if want := float64(inUse) * relistBound; math.Abs(float64(limit)-want) > want*0.1 {
		t.Fatalf("limit %d after a list, want about %.0f (%.2f × %d in use)", limit, want, relistBound, inUse)
	}
	grown := make([]byte, 4*limit) // an index four times the size: more state, not a spike
	for i := range grown {
		grown[i] = 1
	}
	runtime.GC()
	m.grown()
	if now := debug.SetMemoryLimit(-1); now < int64(float64(len(grown))*relistBound) {
		t.Errorf("limit %d after the live heap grew to more than %d, want at least %.0f", now, len(grown), float64(len(grown))*relistBound)
	}
	runtime.KeepAlive(grown)
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
