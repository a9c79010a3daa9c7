package role

import (
	"os"
	"runtime/debug"
	"testing"
)

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
