package dns

import (
	"math"
	"os"
	"runtime/debug"
	rtmetrics "runtime/metrics"
	"sync"
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

// relistGOGC is the collector's GOGC from the moment the pods are listed
// again until the relist's garbage is given back (memory.RelistGCPercent).
// Serving makes so little garbage that the steady heap sits near what is
// live, while a relist of 150,000 pods allocates about 700 MB: at the
// serving GOGC of 25 the heap grew by a quarter of the index through it,
// 6.7 MB of the 9.5 MB its anonymous memory grew (docs/benchmarks.md).
const relistGOGC = 10

// memoryBound keeps the soft memory limit at relistBound times the
// runtime's memory in the steady state: the live heap, the garbage GOGC
// lets the heap grow by between collections, and the rest the runtime
// holds (stacks, its own metadata). It is set after each list, when the
// lists' garbage has just been given back, and raised as the live heap
// grows between lists: the index, and the query path's caches as they
// fill. A limit under the steady state's own garbage would have the
// collector run after every few kilobytes allocated: 3,761 collections,
// a third of the CPU, in a benchmark run of the search-path mix.
// GOMEMLIMIT set by the operator wins.
type memoryBound struct {
	off      bool
	mu       sync.Mutex
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
	{Name: "/gc/gogc:percent"},
}

// runtimeMemory is what the bound reads of the runtime.
type runtimeMemory struct {
	inUse uint64 // what it holds, less what it gave back to the kernel
	live  uint64 // the live heap at the last collection
	gogc  uint64
}

func readMemory() runtimeMemory {
	s := append([]rtmetrics.Sample(nil), memorySamples...)
	rtmetrics.Read(s)
	return runtimeMemory{inUse: s[0].Value.Uint64() - s[1].Value.Uint64(), live: s[2].Value.Uint64(), gogc: s[3].Value.Uint64()}
}

// steady is the memory a live heap of r's needs while serving.
func (m *memoryBound) steady(r runtimeMemory) uint64 {
	return r.live + r.live*r.gogc/100 + m.overhead
}

// listed sets the limit from the memory in use now: call it right after a
// collection that gave a list's garbage back.
func (m *memoryBound) listed() {
	if m.off {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	r := readMemory()
	m.overhead = r.inUse - min(r.live, r.inUse)
	m.set(m.steady(r))
}

// grown raises the limit when the live heap has grown since: more
// Services, endpoints or pods, or fuller caches, are not a spike. Call it
// only while no relist is under way.
func (m *memoryBound) grown() {
	if m.off {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.limit == 0 {
		return
	}
	if want := m.steady(readMemory()); float64(want)*relistBound > float64(m.limit) {
		m.set(want)
	}
}

func (m *memoryBound) set(steady uint64) {
	m.limit = int64(math.Min(float64(steady)*relistBound, math.MaxInt64))
	debug.SetMemoryLimit(m.limit)
}
