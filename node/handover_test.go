package node

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/klog/v2"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/internal/handover"
	"github.com/netplane/netplane/internal/role"
)

// writer is a feature that counts itself as writing the node from its
// take-over (or start) until it stops.
type writer struct {
	d       role.Deps
	writing *atomic.Int32
	most    *atomic.Int32 // the most writers seen at once
	claimed *atomic.Int32 // data paths claimed from a running agent
}

// Run leaves a data path (a pipe's end) running in the agent's keeping
// when it stops, and claims the running agent's when it takes over.
func (w writer) Run(ctx context.Context) error {
	if t := w.d.Takeover; t != nil {
		if !t.Wait(ctx) {
			return nil
		}
		if fs, err := t.Claim(ctx, "datapath"); err == nil && len(fs) > 0 {
			w.claimed.Add(1)
			for _, f := range fs {
				f.Close()
			}
		}
	}
	r, wr, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	if w.d.Keeper != nil {
		defer w.d.Keeper.Keep("datapath", pipeEnd{wr})
	} else {
		defer wr.Close()
	}
	n := w.writing.Add(1)
	for {
		if m := w.most.Load(); n <= m || w.most.CompareAndSwap(m, n) {
			break
		}
	}
	<-ctx.Done()
	w.writing.Add(-1)
	return nil
}

type pipeEnd struct{ f *os.File }

func (p pipeEnd) Hand() ([]*os.File, error) { return []*os.File{p.f}, nil }
func (p pipeEnd) Close() error              { return p.f.Close() }

func agentDeps(path string) role.Deps {
	cfg := &v1alpha1.Configuration{Node: v1alpha1.Node{AgentSocket: path}}
	return role.Deps{Config: cfg, Checks: role.NewChecks(), Log: klog.Background()}
}

// An agent started beside a running one writes only once that one has
// stopped writing; the running one is not ready from the hello on, idles
// after letting go, and a stop asked while its successor gets ready waits
// for the take.
func TestHandOverToANewAgent(t *testing.T) {
	for _, tc := range []struct {
		name       string
		stopBefore bool // the running agent is told to stop before the take
	}{{"rolled with a surge", false}, {"stopped before the new one synced", true}} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "agent.sock")
			var writing, most, claimed atomic.Int32
			oldD := agentDeps(path)
			oldKept := &handover.Parcels{}
			oldD.Keeper = oldKept
			if dialRunning(oldD) != nil {
				t.Fatal("found an agent where none runs")
			}
			oldCtx, stopOld := context.WithCancel(context.Background())
			defer stopOld()
			oldDone := make(chan error, 1)
			go func() {
				oldDone <- runAgent(oldCtx, oldD, []Feature{writer{oldD, &writing, &most, &claimed}}, nil, oldKept)
			}()
			waitFor(t, "the running agent writes", func() bool { return writing.Load() == 1 })
			waitFor(t, "its socket", func() bool { return listening(path) })

			newD := agentDeps(path)
			gate := dialRunning(newD)
			if gate == nil {
				t.Fatal("the new agent did not find the running one")
			}
			newD.Takeover = gate
			gate.Expect(1)
			waitFor(t, "the running agent not ready", func() bool {
				err := oldD.Checks.Ready()
				return err != nil && strings.Contains(err.Error(), errSuccessor.Error())
			})
			if tc.stopBefore {
				stopOld()
				select {
				case err := <-oldDone:
					t.Fatalf("the running agent stopped (%v) before the new one took over", err)
				case <-time.After(100 * time.Millisecond):
				}
			}
			newCtx, stopNew := context.WithCancel(context.Background())
			defer stopNew()
			newDone := make(chan error, 1)
			go func() {
				newDone <- runAgent(newCtx, newD, []Feature{writer{newD, &writing, &most, &claimed}}, gate, &handover.Parcels{})
			}()
			<-gate.Open()
			waitFor(t, "the new agent writes", func() bool { return writing.Load() == 1 })
			if most.Load() != 1 {
				t.Fatalf("%d agents wrote at once", most.Load())
			}
			waitFor(t, "the new agent claimed the running one's data path", func() bool { return claimed.Load() == 1 })
			if !tc.stopBefore {
				if err := oldD.Checks.Ready(); err != nil {
					t.Fatalf("old agent's readiness after handing over: %v; want ready (its port answers the new pod's probes too)", err)
				}
				select {
				case err := <-oldDone:
					t.Fatalf("the old agent exited (%v) before it was told to", err)
				case <-time.After(100 * time.Millisecond):
				}
				stopOld()
			}
			if err := <-oldDone; err != nil {
				t.Fatal(err)
			}
			// The new agent now listens for its own successor.
			waitFor(t, "the new agent's socket", func() bool { return listening(path) })
			stopNew()
			if err := <-newDone; err != nil {
				t.Fatal(err)
			}
		})
	}
}

// listening connects to path and hangs up without a hello: not a
// successor, only a look at whether an agent listens.
func listening(path string) bool {
	c, err := net.Dial("unix", path)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 5s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A new agent that exits before it asked for the node leaves the running
// one writing, and ready again.
func TestASuccessorThatGoesAwayLeavesTheNodeAsItWas(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.sock")
	var writing, most, claimed atomic.Int32
	d := agentDeps(path)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- runAgent(ctx, d, []Feature{writer{d, &writing, &most, &claimed}}, nil, &handover.Parcels{})
	}()
	waitFor(t, "the running agent writes", func() bool { return writing.Load() == 1 })
	waitFor(t, "its socket", func() bool { return listening(path) })
	gone, err := handover.Dial(path)
	if err != nil || gone == nil {
		t.Fatalf("Dial = %v, %v", gone, err)
	}
	waitFor(t, "not ready while a successor is there", func() bool { return d.Checks.Ready() != nil })
	gone.Close()
	waitFor(t, "ready again", func() bool { return d.Checks.Ready() == nil })
	if writing.Load() != 1 {
		t.Fatalf("%d writers, want the running agent's", writing.Load())
	}
	// And a later successor is still served.
	if !listening(path) {
		t.Fatal("no longer listening for a successor")
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
