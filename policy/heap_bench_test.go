package policy

import (
	"runtime"
	"testing"

	"github.com/netplane/netplane/nodeview"
)

// BenchmarkModelHeap is the live heap a model and its rendering hold at
// the scale of the enforcer's bounds (bench_test.go), 1,000 policies ×
// 10,000 pods, IPv4: what the node role keeps for NetworkPolicy between
// syncs, less the records, which the scale holds either way.
func BenchmarkModelHeap(b *testing.B) {
	s := newScale(b, 100, 100, 10, 100, false)
	var held, elems int
	for b.Loop() {
		before := liveHeap()
		m := NewModel(Config{Node: "n0", Families: []nodeview.Family{nodeview.IPv4}})
		s.addTo(m)
		t := newRenderer(m.Table()).full()
		held += int(liveHeap() - before)
		elems = 0
		for _, set := range t.Sets {
			elems += set.Len()
		}
		runtime.KeepAlive(t)
		runtime.KeepAlive(m)
	}
	b.ReportMetric(float64(held)/float64(b.N)/float64(len(s.pods)), "B/pod")
	b.ReportMetric(float64(elems), "elements")
}

func liveHeap() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}
