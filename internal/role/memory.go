package role

import (
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"

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
	startupReserve.Store(nil)
	debug.FreeOSMemory()
	DropExecutablePages()
}

// startupReserve is heap the collector counts as live but nothing touches,
// so it is never resident (ReserveStartupHeap).
var startupReserve atomic.Pointer[[]byte]

// ReserveStartupHeap lets the heap grow by GOGC% of n more before a
// collection until ReleaseStartup. Start-up is a burst of allocation on a
// heap of a few MiB, where Go's collector would otherwise run every few
// MiB: three collections, and a third of the time, in the proxy's first
// sync of 1,000 Services. The reserve costs address space only: fresh
// memory from the kernel is known to be zero and is not written.
func ReserveStartupHeap(n int) {
	b := make([]byte, n)
	startupReserve.Store(&b)
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
