package node

import (
	"context"
	"errors"
	"time"

	"github.com/netplane/netplane/internal/handover"
	"github.com/netplane/netplane/internal/role"
)

// Taking the node over from a running agent, and handing it to the next
// (internal/handover): with --agent-socket, an agent that finds another
// listening there starts as its successor (its loops sync their views but
// write nothing until that agent has let go), and an agent that holds the
// node listens there for its own successor.

// dialRunning finds the agent running on the node; nil when there is none
// or no socket is configured.
func dialRunning(d role.Deps) *handover.Gate {
	path := d.Config.Node.AgentSocket
	if path == "" {
		return nil
	}
	running, err := handover.Dial(path)
	if err != nil {
		d.Log.Error(err, "cannot reach the agent socket: starting as the node's only agent", "socket", path)
		return nil
	}
	if running == nil {
		return nil
	}
	d.Log.Info("another agent runs on this node: taking the node over once every view has synced", "socket", path)
	start := time.Now()
	return handover.NewGate(running, func(err error) {
		if err != nil {
			d.Log.Error(err, "taking the node over: going on as its agent")
			return
		}
		d.Log.Info("took the node over", "after", time.Since(start).Round(time.Millisecond))
	})
}

// claimWait bounds how long a stopping agent that let go of its node keeps
// what the new agent did not claim (peers follow a key's removal within a
// second, wireguard.peersFollow), or serves what it handed over (the old
// WireGuard sessions, 1.5 s).
const claimWait = 2 * time.Second

// errSuccessor is /readyz's answer while a new agent gets ready to take over.
var errSuccessor = errors.New("a new agent is starting on this node and takes it over once its views have synced")

// runAgent runs the features until ctx ends or one fails. With an agent
// socket it first takes the node over when gate is set, then listens for
// a successor. The features run on a context of their own: a stop asked
// while a successor is getting ready waits (up to handover.ReleaseTimeout)
// for it to take over, so the node is never left without a data path.
// What the features leave running in kept (their data paths) runs until
// the successor claims it or this agent returns.
func runAgent(ctx context.Context, d role.Deps, fs []Feature, gate *handover.Gate, kept *handover.Parcels) error {
	defer func() {
		if err := kept.Close(); err != nil {
			d.Log.Error(err, "stopping what the features left running")
		}
	}()
	path := d.Config.Node.AgentSocket
	if path == "" {
		return Run(ctx, fs)
	}
	fctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	defer stop()
	a := &agent{d: d, done: make(chan error, 1), stop: stop, kept: kept}
	go func() { a.done <- Run(fctx, fs) }()
	if gate != nil {
		select {
		case <-gate.Open():
		case err := <-a.done:
			return err
		case <-ctx.Done():
			return a.stopNow()
		}
	}
	ln, err := handover.Listen(path)
	if err != nil {
		d.Log.Error(err, "a new agent on this node will not be able to take it over without a gap")
		select {
		case err := <-a.done:
			return err
		case <-ctx.Done():
			return a.stopNow()
		}
	}
	defer ln.Close()
	for {
		select {
		case err := <-a.done:
			return err
		case <-ctx.Done():
			return a.stopNow()
		case s := <-ln.Successors():
			if handed, err := a.handOver(ctx, ln, s); handed {
				return err
			}
		}
	}
}

// agent is the node's features running, as runAgent started them.
type agent struct {
	d    role.Deps
	done chan error // what the features' Run returned
	stop context.CancelFunc
	kept *handover.Parcels
}

// stopNow stops the features and returns what they returned.
func (a *agent) stopNow() error {
	a.stop()
	return <-a.done
}

// handOver serves one successor: not ready from its hello on, the node is
// its own once it asks (or, stopping, when it has not asked within
// handover.ReleaseTimeout). It reports false when the successor went away
// first, so the next one may come.
func (a *agent) handOver(ctx context.Context, ln *handover.Listener, s *handover.Successor) (bool, error) {
	d := a.d
	d.Log.Info("a new agent is starting on this node; it takes it over once its views have synced")
	d.Checks.AddReady("handover", func() error { return errSuccessor })
	stopping, deadline := ctx.Done(), (<-chan time.Time)(nil)
	for {
		select {
		case <-s.Taking():
			ln.Close()
			err := a.stopNow()
			d.Checks.Retire()
			if rerr := s.Release(a.kept); rerr != nil {
				d.Log.Error(rerr, "telling the new agent the node is its own")
			}
			d.Log.Info("handed the node over to the new agent; idle until stopped")
			<-ctx.Done()
			// Told to stop before the new agent claimed what runs of the
			// data path here: it is served a moment longer (a new agent
			// that runs without it claims nothing, and peers follow
			// the change meanwhile).
			select {
			case <-a.kept.Claimed():
			case <-time.After(claimWait):
			}
			return true, err
		case <-s.Gone():
			d.Log.Info("the new agent went away before taking the node over; going on")
			d.Checks.AddReady("handover", func() error { return nil })
			return false, nil
		case err := <-a.done:
			s.Drop() // it programs the node itself
			return true, err
		case <-stopping:
			stopping, deadline = nil, time.After(handover.ReleaseTimeout)
			d.Log.Info("stopping once the new agent has taken the node over", "atMost", handover.ReleaseTimeout)
		case <-deadline:
			s.Drop()
			d.Log.Info("the new agent did not take the node over in time; stopping")
			return true, a.stopNow()
		}
	}
}
