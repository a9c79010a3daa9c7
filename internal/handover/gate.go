package handover

import (
	"context"
	"os"
	"sync"
)

// Gate holds the first write of each of a successor's sync loops until the
// node is the successor's: each of the Expected loops waits once its views
// have synced; when all wait, the gate takes the node over (Take) and lets
// them all through. A loop that ends before it waits leaves, so that it
// holds up no other.
type Gate struct {
	running Running
	done    func(err error) // told the outcome of the take, once
	taken   error           // its outcome, once open

	mu       sync.Mutex
	expected int
	waiting  int
	open     chan struct{}
	taking   bool
}

// Running is the agent running on the node, as a Predecessor is.
type Running interface {
	Take(ctx context.Context) error
	Claim(ctx context.Context, name string) ([]*os.File, error)
}

// NewGate is a gate that takes the node from running and tells done how
// that went (a failed take still opens the gate: the node needs an agent).
func NewGate(running Running, done func(err error)) *Gate {
	return &Gate{running: running, done: done, open: make(chan struct{})}
}

// Expect sets how many loops will wait (or leave); call it before any.
func (g *Gate) Expect(loops int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.expected = loops
}

// Leave counts out a loop that will not wait.
func (g *Gate) Leave() {
	g.mu.Lock()
	g.expected--
	ready := g.ready()
	g.mu.Unlock()
	if ready {
		go g.takeOver(context.Background())
	}
}

// Wait returns true once the node is this process's, false when ctx ended
// first.
func (g *Gate) Wait(ctx context.Context) bool {
	g.mu.Lock()
	g.waiting++
	ready := g.ready()
	g.mu.Unlock()
	if ready {
		g.takeOver(ctx)
	}
	select {
	case <-g.open:
		return true
	case <-ctx.Done():
		return false
	}
}

// ready reports, with mu held, whether the take is due and claims it.
func (g *Gate) ready() bool {
	if g.taking || g.waiting < g.expected || g.waiting == 0 {
		return false
	}
	g.taking = true
	return true
}

func (g *Gate) takeOver(ctx context.Context) {
	err := g.running.Take(ctx)
	g.taken = err
	g.done(err)
	close(g.open)
}

// Claim returns, once the node is this process's, the files of the data
// path the running agent kept under name (Parcels); none when it kept
// none, or when it did not release the node.
func (g *Gate) Claim(ctx context.Context, name string) ([]*os.File, error) {
	select {
	case <-g.open:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if g.taken != nil {
		return nil, nil
	}
	return g.running.Claim(ctx, name)
}

// Open is closed once the node is this process's.
func (g *Gate) Open() <-chan struct{} { return g.open }
