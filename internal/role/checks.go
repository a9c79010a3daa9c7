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
	mu     sync.Mutex
	health map[string]func() error
	ready  map[string]func() error
}

// NewChecks returns an empty set; with no checks both endpoints report ok.
func NewChecks() *Checks {
	return &Checks{health: map[string]func() error{}, ready: map[string]func() error{}}
}

// AddHealth adds a liveness check to /healthz.
func (c *Checks) AddHealth(name string, check func() error) { c.add(c.health, name, check) }

// AddReady adds a readiness check to /readyz (for example "caches synced").
func (c *Checks) AddReady(name string, check func() error) { c.add(c.ready, name, check) }

func (c *Checks) add(m map[string]func() error, name string, check func() error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m[name] = check
}

// Health returns the liveness checks added so far.
func (c *Checks) Health() map[string]func() error { return c.snapshot(c.health) }

// Readiness returns the readiness checks added so far.
func (c *Checks) Readiness() map[string]func() error { return c.snapshot(c.ready) }

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
