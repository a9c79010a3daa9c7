package proxy

import (
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/tools/cache"
)

// TestTriggerTimesCountOnlyAfterStart: network programming latency is
// measured from a slice's last-change-trigger-time, as kube-proxy does:
// deletions (tombstones too) count, times from before the proxier started
// (the initial list's, maybe days old) do not.
func TestTriggerTimesCountOnlyAfterStart(t *testing.T) {
	start := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	p := &proxier{started: start, metrics: newMetrics(prometheus.NewRegistry()), kick: make(chan struct{}, 1)}
	at := func(d time.Duration) *sliceRecord { return &sliceRecord{trigger: start.Add(d)} }
	p.changed(at(-time.Hour))
	p.changed(&sliceRecord{})
	p.changed(&serviceRecord{})
	p.changed(at(time.Second))
	p.changed(cache.DeletedFinalStateUnknown{Key: "ns/e", Obj: at(2 * time.Second)})
	if want := []time.Time{start.Add(time.Second), start.Add(2 * time.Second)}; !slices.Equal(p.triggers, want) {
		t.Errorf("trigger times %v, want %v", p.triggers, want)
	}
	if p.pending != 5 {
		t.Errorf("%d changes pending, want 5", p.pending)
	}
}
