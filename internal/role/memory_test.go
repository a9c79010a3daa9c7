package role

import (
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestOnlyTheExecutablesPristineReadOnlyMappingsAreDropped(t *testing.T) {
	smaps := `00400000-01437000 r-xp 00000000 fe:00 326269    /usr/bin/netplane
Rss:               13912 kB
Anonymous:             0 kB
01437000-0256b000 r--p 01037000 fe:00 326269    /usr/bin/netplane
Rss:               12620 kB
Anonymous:             0 kB
c000000000-c000400000 rw-p 00000000 00:00 0
Anonymous:          4096 kB
0256b000-02570000 r--p 0216b000 fe:00 326269    /usr/bin/netplane
Rss:                  20 kB
Anonymous:            20 kB
02570000-02600000 rw-p 02170000 fe:00 326269    /usr/bin/netplane
Anonymous:           468 kB
02600000-04649000 rw-p 00000000 00:00 0
Anonymous:           132 kB
7f6b83550000-7f6b83800000 r-xp 00000000 fe:00 111 /usr/lib/libc.so.6
Anonymous:             0 kB
7ffd22704000-7ffd22725000 rw-p 00000000 00:00 0    [stack]
garbage line
`
	got := pristineMappings(smaps, "/usr/bin/netplane")
	want := []addrRange{{0x400000, 0x1437000}, {0x1437000, 0x256b000}}
	if !slices.Equal(got, want) {
		t.Errorf("mappings to drop: %x, want %x (the executable's code and constants, never its data nor pages it changed)", got, want)
	}
}

// The start-up reserve counts for the collector but is never resident,
// and ReleaseStartup lets it go.
func TestStartupReserveIsNotResident(t *testing.T) {
	rss := func() int {
		b, err := os.ReadFile("/proc/self/status")
		if err != nil {
			t.Skip(err)
		}
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
				kb, _ := strconv.Atoi(f[1])
				return kb
			}
		}
		t.Skip("no VmRSS")
		return 0
	}
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	r0 := rss()
	ReserveStartupHeap(256 << 20)
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if grown := rss() - r0; grown > 16<<10 {
		t.Errorf("a 256 MiB reserve made %d KiB resident", grown)
	}
	if after.HeapAlloc-before.HeapAlloc < 256<<20 {
		t.Errorf("the collector does not count the reserve: heap grew by %d bytes", after.HeapAlloc-before.HeapAlloc)
	}
	ReleaseStartup()
	if startupReserve.Load() != nil {
		t.Error("ReleaseStartup kept the reserve")
	}
}
