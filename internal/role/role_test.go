package role

import (
	"os"
	"runtime/debug"
	"testing"

	"github.com/go-logr/logr"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/netplane/netplane/internal/informer"
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

// A role is named not ready from the start: until it adds a readiness check
// of its name, or waits for its caches under another name.
func TestARoleIsNotReadyUntilItAddsItsChecks(t *testing.T) {
	checks := NewChecks()
	checks.Starting("dns")
	checks.Starting("node")
	if err := checks.Ready(); err == nil || err.Error() != "dns: starting\nnode: starting" {
		t.Fatalf("Ready() = %v, want both roles starting", err)
	}
	checks.AddReady("dns", func() error { return nil })
	d := Deps{Role: "node", Checks: checks, Factory: informer.New(fake.NewClientset()), Log: logr.Discard()}
	if !WaitForSync(t.Context(), d, "proxy") {
		t.Fatal("WaitForSync with nothing to wait for returned false")
	}
	if err := checks.Ready(); err != nil {
		t.Errorf("Ready() = %v once the node role waited for its caches as proxy", err)
	}
}
