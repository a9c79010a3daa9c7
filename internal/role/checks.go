package role

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
)

// Checks is the set of named liveness and readiness checks the roles add as
// they start (a role knows its checks only once it runs, after the process
// began serving /healthz and /readyz). A check returns nil when all is well
// and an error saying what is wrong otherwise. The process serves them.
type Checks struct {
	mu       sync.Mutex
	health   map[string]func() error
	ready    map[string]func() error
	starting map[string]bool // roles that added no readiness check yet
	retired  bool
}

// NewChecks returns an empty set; with no checks both endpoints report ok.
func NewChecks() *Checks {
	return &Checks{health: map[string]func() error{}, ready: map[string]func() error{}, starting: map[string]bool{}}
}

var errStarting = errors.New("starting")

// Starting has /readyz name role as not ready until the role adds a
// readiness check of that name, or waits for caches under another name
// (WaitForSync). The process serves /readyz before its roles run: without
// it, the moment before a role adds its checks would answer ok.
func (c *Checks) Starting(role string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.starting[role] = true
}

func (c *Checks) started(role string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.starting, role)
}

// AddHealth adds a liveness check to /healthz.
func (c *Checks) AddHealth(name string, check func() error) { c.add(c.health, name, check) }

// AddReady adds a readiness check to /readyz (for example "caches synced").
func (c *Checks) AddReady(name string, check func() error) {
	c.add(c.ready, name, check)
	c.started(name)
}

func (c *Checks) add(m map[string]func() error, name string, check func() error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m[name] = check
}

// Retire is for a process that let go of its work on purpose (a node
// agent that handed its node over to a new one): from now on /healthz and
// /readyz are ok, whatever its checks said, since nothing of it can fall
// behind. Ready, not failing: on the host network the new agent's pod is
// probed on the same port, and may be answered by this process until it
// exits.
func (c *Checks) Retire() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.retired = true
}

// Health returns the liveness checks added so far.
func (c *Checks) Health() map[string]func() error {
	c.mu.Lock()
	retired := c.retired
	c.mu.Unlock()
	if retired {
		return map[string]func() error{}
	}
	return c.snapshot(c.health)
}

// Readiness returns the readiness checks added so far, and one failing for
// each role still starting.
func (c *Checks) Readiness() map[string]func() error {
	out := c.snapshot(c.ready)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.retired {
		return map[string]func() error{}
	}
	for role := range c.starting {
		out[role] = func() error { return errStarting }
	}
	return out
}

func (c *Checks) snapshot(m map[string]func() error) map[string]func() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(m)
}

// Ready reports whether every readiness check passes, naming each that does not.
func (c *Checks) Ready() error {
	checks := c.Readiness()
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(checks)) {
		if err := checks[name](); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}
