package role

import (
	"testing"

	"github.com/go-logr/logr"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/netplane/netplane/internal/informer"
)

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
