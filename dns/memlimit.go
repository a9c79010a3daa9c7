package dns

import (
	"math"
	"os"
	"runtime/debug"
	rtmetrics "runtime/metrics"
)

// relistBound is how far above its steady state the role lets the Go
// runtime's memory grow. A relist (every reflector lists again after an
// API server restart) decodes every pod of the cluster a page at a time
// while the index is still held: at GOGC 50 the heap grew by 80% through a
// relist of 15,000 pods (docs/benchmarks.md). Go's soft memory limit makes
// the collector run as often as it takes to stay under it, at up to half
// the CPU, for the while: answers slow down, the process is not killed
// for memory, as 233 of 313 CoreDNS pods were in upstream's 5,000-node
// scale test (kubernetes/kubernetes#139117).
const relistBound = 1.25

// memoryBound keeps the soft memory limit at relistBound times the
// runtime's memory in the steady state: set after each list, when the
// lists' garbage has just been given back, and raised as the index grows
// between lists. GOMEMLIMIT set by the operator wins.
type memoryBound struct {
	off      bool
	overhead uint64 // the runtime's memory beside the live heap, at the last list
	limit    int64
}

func newMemoryBound() *memoryBound {
	_, set := os.LookupEnv("GOMEMLIMIT")
	return &memoryBound{off: set}
}

var memorySamples = []rtmetrics.Sample{
	{Name: "/memory/classes/total:bytes"},
	{Name: "/memory/classes/heap/released:bytes"},
	{Name: "/gc/heap/live:bytes"},
}

// read is the runtime's memory in use (what it holds, less what it gave
// back to the kernel) and its live heap at the last collection.
func readMemory() (inUse, live uint64) {
	s := append([]rtmetrics.Sample(nil), memorySamples...)
	rtmetrics.Read(s)
	return s[0].Value.Uint64() - s[1].Value.Uint64(), s[2].Value.Uint64()
}

// listed sets the limit from the memory in use now: call it right after a
// collection that gave a list's garbage back.
func (m *memoryBound) listed() {
	if m.off {
		return
	}
	inUse, live := readMemory()
	m.overhead = inUse - min(live, inUse)
	m.set(inUse)
}

// grown raises the limit when the live heap has grown since: more
// Services, endpoints or pods are not a spike.
func (m *memoryBound) grown() {
	if m.off || m.limit == 0 {
		return
	}
	_, live := readMemory()
	if want := live + m.overhead; float64(want)*relistBound > float64(m.limit) {
		m.set(want)
	}
}

func (m *memoryBound) set(steady uint64) {
	m.limit = int64(math.Min(float64(steady)*relistBound, math.MaxInt64))
	debug.SetMemoryLimit(m.limit)
}
