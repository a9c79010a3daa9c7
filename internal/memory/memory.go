// Package memory tunes the process's memory: the collector's GOGC that
// roles holding a big state ask for, headroom for a start-up sync, and
// giving back what start-up used and serving does not.
package memory

import (
	"os"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// ReleaseStartup gives back what start-up used and serving does not: the
// garbage of the initial lists, and the pages of the executable that only
// initialisation read (type registrations of every API group the binary
// links, the code of the other roles). Those stay mapped and count as the
// process's resident memory for as long as it runs; unmapped, they are
// ordinary page cache the kernel reclaims when it needs to, and the few
// the role uses come back on first touch without I/O while cached.
func ReleaseStartup() {
	EndStartupHeadroom()
	gcMu.Lock()
	if relistGOGC != 0 {
		debug.SetGCPercent(relistGOGC)
		relistGOGC = 0
	}
	serving := servingGOGC
	gcMu.Unlock()
	if serving > 0 {
		DefaultGCPercent(serving)
	}
	debug.FreeOSMemory()
	DropExecutablePages()
}

// ServingGCPercent sets the collector's GOGC to percent from the next
// ReleaseStartup on (as DefaultGCPercent: the lowest asked for, and never
// over an operator's $GOGC). A role whose start-up allocates fast and
// whose serving holds a large state and makes little garbage (the node
// role at a cluster's published limits) starts at its default and keeps
// its heap closer to what is live once it serves.
func ServingGCPercent(percent int) {
	gcMu.Lock()
	defer gcMu.Unlock()
	if servingGOGC == 0 || percent < servingGOGC {
		servingGOGC = percent
	}
}

// servingGOGC is the GOGC ReleaseStartup sets; 0: none.
var servingGOGC int

// EndStartupHeadroom restores the GOGC StartupHeadroom raised: after the
// first big piece of work even when it failed, or the raised percentage
// would apply to a heap that grows while it is retried.
func EndStartupHeadroom() {
	gcMu.Lock()
	defer gcMu.Unlock()
	if startupGOGC != 0 {
		debug.SetGCPercent(startupGOGC)
		startupGOGC = 0
	}
}

// startupGOGC is the GOGC StartupHeadroom raised, to restore; 0: none.
var startupGOGC int

// StartupHeadroom lets the heap grow by n bytes from now before the next
// collection, until EndStartupHeadroom. Right after start-up the live heap
// is a few MiB, and at GOGC 50 the collector would run every few MiB of the
// first big piece of work: three times, and a third of the time, in the
// proxy's first sync of 1,000 Services. It raises GOGC for the while (a
// heap big enough to have the headroom keeps its GOGC) and leaves an
// operator's $GOGC alone. Unlike a ballast allocation it touches nothing:
// Go zeroes a large allocation that reuses freed pages, which made one
// resident.
func StartupHeadroom(n uint64) {
	if _, set := os.LookupEnv("GOGC"); set {
		return
	}
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/memory/classes/heap/objects:bytes"}, {Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	live, now, pct := s[0].Value.Uint64(), s[1].Value.Uint64(), s[2].Value.Uint64()
	if live == 0 || now+n <= live {
		return
	}
	// The next collection comes when the heap reaches live × (1 + GOGC/100).
	want := (now + n - live) * 100 / live
	if want <= pct {
		return
	}
	gcMu.Lock()
	defer gcMu.Unlock()
	if old := debug.SetGCPercent(int(want)); startupGOGC == 0 {
		startupGOGC = old
	}
}

// DropExecutablePages is ReleaseStartup without the garbage collection,
// cheap enough to run before a role's first big piece of work.
func DropExecutablePages() {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return
	}
	smaps, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		return
	}
	for _, r := range pristineMappings(string(smaps), exe) {
		// Best effort: nothing is lost if the kernel declines.
		_, _, _ = unix.Syscall(unix.SYS_MADVISE, r.start, r.end-r.start, unix.MADV_DONTNEED)
	}
}

type addrRange struct{ start, end uintptr }

// pristineMappings are the mappings of file in a /proc/<pid>/smaps listing
// that the process cannot write and never wrote (no anonymous pages: a
// position-independent executable's relocated constants are private
// copies, which dropping would undo). Their pages always equal the file's,
// so dropping them loses nothing.
func pristineMappings(smaps, file string) []addrRange {
	var out []addrRange
	var cur *addrRange
	keep := false
	flush := func() {
		if cur != nil && keep {
			out = append(out, *cur)
		}
		cur, keep = nil, false
	}
	for _, line := range strings.Split(smaps, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 5 && strings.Contains(f[0], "-") && len(f[1]) == 4: // a mapping's first line
			flush()
			lo, hi, _ := strings.Cut(f[0], "-")
			start, err1 := strconv.ParseUint(lo, 16, 64)
			end, err2 := strconv.ParseUint(hi, 16, 64)
			if err1 == nil && err2 == nil && end > start && len(f) >= 6 && f[5] == file {
				cur, keep = &addrRange{uintptr(start), uintptr(end)}, f[1][1] != 'w'
			}
		case cur != nil && len(f) >= 2 && f[0] == "Anonymous:" && f[1] != "0":
			keep = false
		}
	}
	flush()
	return out
}

// DefaultGCPercent sets the collector's GOGC to percent unless the operator
// chose one with $GOGC. The process-wide setting is the lowest any of its
// roles asks for. Roles holding a big, long-lived state (the DNS index, the
// proxy's model) use it: at Go's default the heap may grow to twice what is
// live before a collection.
func DefaultGCPercent(percent int) {
	if _, set := os.LookupEnv("GOGC"); set {
		return
	}
	gcMu.Lock()
	defer gcMu.Unlock()
	if old := debug.SetGCPercent(percent); old >= 0 && old < percent {
		debug.SetGCPercent(old)
	}
}

var gcMu sync.Mutex

// RelistGCPercent lowers the collector's GOGC to percent until the next
// ReleaseStartup, unless the operator chose one with $GOGC. A relist
// decodes every object of the cluster again while the state built from
// them is held: the heap grows by GOGC percent of that state between two
// collections, while serving makes so little garbage that the steady
// heap stays near what is live.
func RelistGCPercent(percent int) {
	if _, set := os.LookupEnv("GOGC"); set {
		return
	}
	gcMu.Lock()
	defer gcMu.Unlock()
	old := debug.SetGCPercent(percent)
	if old < 0 || old <= percent {
		debug.SetGCPercent(old)
		return
	}
	if relistGOGC == 0 {
		relistGOGC = old
	}
}

// relistGOGC is the GOGC RelistGCPercent lowered, restored by
// ReleaseStartup; 0: none.
var relistGOGC int
