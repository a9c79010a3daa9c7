package runner

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/netplane/netplane/e2e/framework"
)

// recorder is a sync function that records its calls and fails on demand.
type recorder struct {
	mu      sync.Mutex
	entered int // syncs begun, also those waiting on block
	calls   []call
	fail    int           // the next fail calls fail
	block   chan struct{} // if set, each call waits on it
	start   time.Time
}

type call struct {
	full bool
	at   time.Duration
}

func (r *recorder) sync(ctx context.Context, full bool) error {
	r.mu.Lock()
	r.entered++
	r.mu.Unlock()
	if r.block != nil {
		<-r.block
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, call{full, time.Since(r.start)})
	if r.fail > 0 {
		r.fail--
		return errors.New("kernel said no")
	}
	return nil
}

func (r *recorder) snapshot() []call {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]call(nil), r.calls...)
}

func (r *recorder) waitCalls(t *testing.T, n int) []call {
	t.Helper()
	framework.EventuallyEvery(t, time.Millisecond, 5*time.Second, fmt.Sprintf("%d syncs", n), func() error {
		if got := r.snapshot(); len(got) < n {
			return fmt.Errorf("%d syncs: %+v", len(got), got)
		}
		return nil
	})
	return r.snapshot()
}

func run(t *testing.T, rec *recorder, o Options) *Runner {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := New(rec.sync, o)
	rec.start = time.Now()
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return r
}

func fulls(cs []call) string {
	var b strings.Builder
	for _, c := range cs {
		if c.full {
			b.WriteByte('F')
		} else {
			b.WriteByte('p')
		}
	}
	return b.String()
}

func TestTheFirstSyncIsFullAndImmediateAndRequestsArePartial(t *testing.T) {
	rec := &recorder{}
	r := run(t, rec, Options{})
	rec.waitCalls(t, 1)
	r.Request()
	cs := rec.waitCalls(t, 2)
	if got := fulls(cs); got != "Fp" {
		t.Errorf("syncs %q, want Fp", got)
	}
	if cs[0].at > 100*time.Millisecond {
		t.Errorf("first sync after %v, want at once", cs[0].at)
	}
}

func TestRequestsDuringASyncRunOneMoreSync(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{block: make(chan struct{})}
		r := run(t, rec, Options{})
		synctest.Wait() // the first sync has begun and waits on block
		for range 10 {
			r.Request()
		}
		rec.block <- struct{}{} // the first sync ends; ten requests wait
		rec.block <- struct{}{} // they run as one
		// Once every goroutine of the test is blocked, the runner either
		// waits for work or has begun a third sync, which waits on block.
		synctest.Wait()
		rec.mu.Lock()
		if rec.entered != 2 {
			t.Errorf("%d syncs began, want 2: a third ran for requests already served", rec.entered)
		}
		rec.mu.Unlock()
		close(rec.block) // lets a third sync end, so the runner can stop
	})
}

func TestMinIntervalSpacesAStreamOfRequestsAfterABurstOfTwo(t *testing.T) {
	rec := &recorder{}
	min := 100 * time.Millisecond
	r := run(t, rec, Options{MinInterval: min})
	rec.waitCalls(t, 1)
	for i := 0; i < 4; i++ {
		r.Request()
		rec.waitCalls(t, i+2)
	}
	cs := rec.snapshot()
	// The first sync and one more use the burst; the later ones wait.
	if cs[1].at > min/2 {
		t.Errorf("second sync after %v, want at once (burst of two)", cs[1].at)
	}
	for i := 3; i < len(cs); i++ {
		if gap := cs[i].at - cs[i-1].at; gap < min*8/10 {
			t.Errorf("sync %d came %v after the one before, want about %v", i, gap, min)
		}
	}
}

func TestAFailedSyncIsRetriedAsAFullSync(t *testing.T) {
	rec := &recorder{}
	r := run(t, rec, Options{RetryAfter: 50 * time.Millisecond})
	rec.waitCalls(t, 1)
	rec.mu.Lock()
	rec.fail = 1
	rec.mu.Unlock()
	r.Request() // a partial sync, which fails
	rec.waitCalls(t, 2)
	r.Request() // before the retry is due: full all the same
	cs := rec.waitCalls(t, 3)
	if got := fulls(cs); got != "FpF" {
		t.Errorf("syncs %q, want FpF (after a failure the next sync is full)", got)
	}
	if cs[2].at-cs[1].at > 40*time.Millisecond {
		t.Errorf("the request after a failure waited %v for the retry, want it served at once", cs[2].at-cs[1].at)
	}
	rec.mu.Lock()
	rec.fail = 1
	rec.mu.Unlock()
	r.Request()
	if got := fulls(rec.waitCalls(t, 5)); got != "FpFpF" {
		t.Errorf("syncs %q, want FpFpF (a failed sync is retried by itself, fully)", got)
	}
}

func TestFullSyncsRunEveryFullInterval(t *testing.T) {
	rec := &recorder{}
	run(t, rec, Options{FullInterval: 30 * time.Millisecond})
	if got := fulls(rec.waitCalls(t, 3)); got != "FFF" {
		t.Errorf("syncs %q, want FFF", got)
	}
}

func TestHealthyFailsWhenARequestWaitsTooLong(t *testing.T) {
	rec := &recorder{fail: 1000}
	r := run(t, rec, Options{RetryAfter: time.Millisecond})
	rec.waitCalls(t, 1)
	r.Request()
	time.Sleep(30 * time.Millisecond)
	if err := r.Healthy(10 * time.Millisecond); err == nil {
		t.Error("healthy while every sync fails")
	}
	if err := r.Healthy(time.Hour); err != nil {
		t.Errorf("unhealthy within the limit: %v", err)
	}
	rec.mu.Lock()
	rec.fail = 0
	rec.mu.Unlock()
	_ = wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		return !r.LastSuccess().IsZero(), nil
	}) // Healthy is checked below
	if err := r.Healthy(10 * time.Millisecond); err != nil {
		t.Errorf("still unhealthy after a successful sync: %v", err)
	}
}
