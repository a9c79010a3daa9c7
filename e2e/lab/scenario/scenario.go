// Package scenario holds the lab's end-to-end scenarios as plain functions
// of a running lab, so `make demo` (netplane-lab check) and the Go tests in
// e2e/scenarios run exactly the same checks.
package scenario

import (
	"context"

	"github.com/netplane/netplane/e2e/lab"
)

// Scenario is one check of the lab.
type Scenario struct {
	Name string
	Run  func(ctx context.Context, l *lab.Lab, logf func(string, ...any)) error
}

// All is every scenario in the order the demo shows them.
var All = []Scenario{}

// Skipped is what a scenario returns when the lab it runs in has nothing
// for it to check; it says why.
type Skipped struct{ Why string }

func (s Skipped) Error() string { return "skipped: " + s.Why }

// Blocked are scenarios seen failing because of a netplane component, not
// the lab, by number; each says what fails. The demo and the tests print
// it instead of running the scenario. Remove an entry when it is fixed.
var Blocked = map[string]string{}
