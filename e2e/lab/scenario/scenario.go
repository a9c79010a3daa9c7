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
var Blocked = map[string]string{
	"12": "with the userspace WireGuard implementation an encryption rollout under load can still lose a DNS query: " +
		"at each node agent's replacement the new wireguard-go takes the old one's sessions over a relay (docs/encryption.md), " +
		"but the node's UDP port has no owner between the old socket's close and the new bind (wireguard-go cannot hand a " +
		"socket over), 0.2-2 ms at load 2 and up to 5 ms at load 4, and what reaches the node then is lost: on a dual lab at " +
		"load 1.4-2.5 six runs of six lost nothing; with two busy loops beside it (load 3.5-4.3) one of three lost one query " +
		"(and the request waiting on it), and so did the one run in make test's lab; the kernel implementation keeps its " +
		"socket, but this machine has no WireGuard module",
}
