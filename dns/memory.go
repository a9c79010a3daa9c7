package dns

import (
	"os"
	"runtime/debug"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// gcPercent is the dns role's GOGC unless the environment sets one. The
// index is long-lived and queries make only short-lived garbage, so the
// default (the heap may grow to twice what is live) would spend most of
// the server's memory on garbage; a quarter costs a few percent of CPU at
// full load (dns/README.md has the measurement).
const gcPercent = 25

// tuneGC sets gcPercent unless the operator chose with GOGC.
func tuneGC() {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(gcPercent)
	}
}

// releaseStartup gives back what start-up used and serving does not: the
// garbage of the initial lists, and the pages of the executable that only
// initialisation read (type registrations of every API group the binary
// links, the code of the other roles). Those stay mapped, resident and
// counted until the kernel needs the memory; paged out, the few the server
// uses come back on first touch.
func releaseStartup() {
	debug.FreeOSMemory()
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return
	}
	for _, r := range readOnlyMappings(string(maps), exe) {
		// Best effort: a kernel before 5.4 does not know MADV_PAGEOUT.
		_, _, _ = unix.Syscall(unix.SYS_MADVISE, r.start, r.end-r.start, unix.MADV_PAGEOUT)
	}
}

type addrRange struct{ start, end uintptr }

// readOnlyMappings are the mappings of file in a /proc/<pid>/maps listing
// that the process cannot write: code and constants, whose pages always
// equal the file's and so can be dropped and read again at any time.
func readOnlyMappings(maps, file string) []addrRange {
	var out []addrRange
	for _, line := range strings.Split(maps, "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || f[5] != file || len(f[1]) < 2 || f[1][1] == 'w' {
			continue
		}
		lo, hi, ok := strings.Cut(f[0], "-")
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if ok && err1 == nil && err2 == nil && end > start {
			out = append(out, addrRange{uintptr(start), uintptr(end)})
		}
	}
	return out
}
