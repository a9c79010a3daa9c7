package kit

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
)

// TestLoopRunsAgainAfterItsEnd: a Loop whose run ended (its replica lost
// the Lease) runs again on the same queue. A key added between the runs
// waits for the second, which also queues every key (Keys) and syncs
// them; nothing is synced between the runs.
func TestLoopRunsAgainAfterItsEnd(t *testing.T) {
	m, err := NewMetrics(prometheus.NewRegistry(), "rerun", func() int { return 0 })
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var synced []string
	seen := make(chan string, 100)
	l := &Loop{Queue: NewQueue("rerun"), Metrics: m, Log: testr.New(t),
		Keys: func() []string { return []string{"ns/every"} },
		Sync: func(_ context.Context, key string) error {
			mu.Lock()
			synced = append(synced, key)
			mu.Unlock()
			seen <- key
			return nil
		}}
	run := func(want ...string) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { l.Run(ctx, 2); close(done) }()
		for len(want) > 0 {
			select {
			case key := <-seen:
				want = slices.DeleteFunc(want, func(w string) bool { return w == key })
			case <-time.After(10 * time.Second):
				t.Fatalf("keys %v not synced within 10s", want)
			}
		}
		cancel()
		<-done
	}
	l.Queue.Add("ns/a")
	run("ns/a")
	l.Queue.Add("ns/b")
	mu.Lock()
	between := slices.Clone(synced)
	mu.Unlock()
	if !slices.Equal(between, []string{"ns/a"}) {
		t.Errorf("synced %v by the end of the first run, want [ns/a]", between)
	}
	run("ns/b", "ns/every")
}

// TestLoopKeepsForTheNextRunWhatItDidNotTake: workers under a write budget
// stop, when the run ends, without taking the keys still queued; those
// wait in the next run's queue instead of going down with this one's.
func TestLoopKeepsForTheNextRunWhatItDidNotTake(t *testing.T) {
	m, err := NewMetrics(prometheus.NewRegistry(), "keep", func() int { return 0 })
	if err != nil {
		t.Fatal(err)
	}
	// A bucket that holds no token: no worker ever takes a key.
	l := &Loop{Queue: NewQueue("keep"), Metrics: m, Log: testr.New(t), Budget: NewWriteBudget(1, 0),
		Sync: func(context.Context, string) error {
			t.Error("a key was synced without a write token")
			return nil
		}}
	for _, k := range []string{"ns/a", "ns/b", "ns/c"} {
		l.Queue.Add(k)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	l.Run(ctx, 2)
	if n := l.Queue.Len(); n != 3 {
		t.Errorf("%d keys wait for the next run, want the 3 not taken", n)
	}
}
