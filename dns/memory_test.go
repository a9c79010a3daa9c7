package dns

import (
	"slices"
	"testing"
)

func TestOnlyTheExecutablesReadOnlyMappingsArePagedOut(t *testing.T) {
	maps := `00400000-01437000 r-xp 00000000 fe:00 326269    /usr/bin/netplane
01437000-0256b000 r--p 01037000 fe:00 326269    /usr/bin/netplane
0256b000-02600000 rw-p 0216b000 fe:00 326269    /usr/bin/netplane
02600000-04649000 rw-p 00000000 00:00 0
7f6b83550000-7f6b83800000 r-xp 00000000 fe:00 111 /usr/lib/libc.so.6
7ffd22704000-7ffd22725000 rw-p 00000000 00:00 0    [stack]
garbage line
`
	got := readOnlyMappings(maps, "/usr/bin/netplane")
	want := []addrRange{{0x400000, 0x1437000}, {0x1437000, 0x256b000}}
	if !slices.Equal(got, want) {
		t.Errorf("mappings to page out: %x, want %x (code and constants of the executable, never its data)", got, want)
	}
}
