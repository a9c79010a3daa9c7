package memory

import (
	"os"
	"runtime"
	"runtime/debug"
	"slices"
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

// StartupHeadroom raises GOGC so that the heap may grow by the headroom
// before a collection, never lowers it, and ReleaseStartup restores it.
func TestStartupHeadroomRaisesGOGCUntilReleased(t *testing.T) {
	if _, set := os.LookupEnv("GOGC"); set {
		t.Skip("$GOGC is set")
	}
	defer debug.SetGCPercent(debug.SetGCPercent(50))
	runtime.GC()
	StartupHeadroom(1 << 30)
	raised := debug.SetGCPercent(-1)
	debug.SetGCPercent(raised)
	if raised <= 50 {
		t.Errorf("GOGC %d after asking for 1 GiB of headroom; want it raised", raised)
	}
	ReleaseStartup()
	if got := debug.SetGCPercent(50); got != 50 {
		t.Errorf("GOGC %d after ReleaseStartup, want 50 back", got)
	}
	StartupHeadroom(1) // a heap with the headroom already
	if got := debug.SetGCPercent(50); got != 50 {
		t.Errorf("GOGC %d after asking for 1 byte of headroom, want 50", got)
	}
}

func TestDefaultGCPercentKeepsTheLowestAndYieldsToGOGC(t *testing.T) {
	old := debug.SetGCPercent(100)
	defer debug.SetGCPercent(old)
	cases := []struct {
		name  string
		gogc  string // "" means unset
		calls []int
		want  int
	}{
		{"one role", "", []int{50}, 50},
		{"the lowest of two roles, in either order", "", []int{50, 80}, 50},
		{"the lowest of two roles, reversed", "", []int{80, 50}, 50},
		{"the operator's GOGC wins", "200", []int{50}, 100},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			debug.SetGCPercent(100)
			t.Setenv("GOGC", c.gogc) // restored after the case
			if c.gogc == "" {
				os.Unsetenv("GOGC")
			}
			for _, p := range c.calls {
				DefaultGCPercent(p)
			}
			if got := debug.SetGCPercent(100); got != c.want {
				t.Errorf("GC percent = %d, want %d", got, c.want)
			}
		})
	}
}

func TestServingGCPercentAppliesWhenStartUpIsReleased(t *testing.T) {
	old := debug.SetGCPercent(100)
	defer debug.SetGCPercent(old)
	defer func() { servingGOGC = 0 }()
	for _, c := range []struct {
		name   string
		gogc   string // "" means unset
		before int    // the role's default, set at start
		asked  []int
		want   int // after ReleaseStartup
	}{
		{"lowered once start-up is over", "", 50, []int{25}, 25},
		{"the lowest asked for", "", 50, []int{40, 25, 30}, 25},
		{"never raised over the default", "", 20, []int{25}, 20},
		{"the operator's GOGC wins", "80", 50, []int{25}, 100},
	} {
		t.Run(c.name, func(t *testing.T) {
			debug.SetGCPercent(100)
			servingGOGC = 0
			t.Setenv("GOGC", c.gogc)
			if c.gogc == "" {
				os.Unsetenv("GOGC")
			}
			DefaultGCPercent(c.before)
			for _, p := range c.asked {
				ServingGCPercent(p)
			}
			if c.gogc == "" {
				got := debug.SetGCPercent(-1)
				debug.SetGCPercent(got)
				if got != c.before {
					t.Errorf("GOGC %d before start-up was released, want %d", got, c.before)
				}
			}
			ReleaseStartup()
			if got := debug.SetGCPercent(100); got != c.want {
				t.Errorf("GC percent = %d, want %d", got, c.want)
			}
		})
	}
}

func TestRelistGCPercentLowersGOGCUntilReleased(t *testing.T) {
	old := debug.SetGCPercent(100)
	defer debug.SetGCPercent(old)
	defer func() { relistGOGC, servingGOGC = 0, 0 }()
	gogc := func() int {
		p := debug.SetGCPercent(-1)
		debug.SetGCPercent(p)
		return p
	}
	for _, c := range []struct {
		name        string
		env         string // "" means unset
		serving     int
		relist      []int
		during, end int
	}{
		{"lowered through the relist", "", 25, []int{10}, 10, 25},
		{"asked twice, the first level comes back", "", 25, []int{10, 5}, 5, 25},
		{"never raised", "", 5, []int{10}, 5, 5},
		{"the operator's GOGC wins", "80", 25, []int{10}, 100, 100},
	} {
		t.Run(c.name, func(t *testing.T) {
			relistGOGC, servingGOGC = 0, 0
			debug.SetGCPercent(100)
			t.Setenv("GOGC", c.env)
			if c.env == "" {
				os.Unsetenv("GOGC")
				debug.SetGCPercent(c.serving)
			}
			for _, p := range c.relist {
				RelistGCPercent(p)
			}
			if got := gogc(); got != c.during {
				t.Errorf("GOGC %d through the relist, want %d", got, c.during)
			}
			ReleaseStartup()
			if got := gogc(); got != c.end {
				t.Errorf("GOGC %d once released, want %d", got, c.end)
			}
		})
	}
}
