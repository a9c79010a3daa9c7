package proxy

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/netplane/netplane/internal/runner"
	"github.com/netplane/netplane/nodeview"
)

// TestTriggerTimesCountOnlyAfterStart: network programming latency is
// measured from a slice's last-change-trigger-time, as kube-proxy does:
// deletions (tombstones too) count, times from before the proxier started
// (the initial list's, maybe days old) do not.
func TestTriggerTimesCountOnlyAfterStart(t *testing.T) {
	start := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	p := &proxier{changes: changes{gauge: newMetrics().pendingChanges, started: start}, runner: idleRunner()}
	at := func(d time.Duration) *sliceRecord { return &sliceRecord{trigger: start.Add(d)} }
	p.changed(at(-time.Hour))
	p.changed(&sliceRecord{})
	p.changed(&serviceRecord{})
	p.changed(at(time.Second))
	p.changed(cache.DeletedFinalStateUnknown{Key: "ns/e", Obj: at(2 * time.Second)})
	if want := []time.Time{start.Add(time.Second), start.Add(2 * time.Second)}; !slices.Equal(p.changes.triggers, want) {
		t.Errorf("trigger times %v, want %v", p.changes.triggers, want)
	}
	if p.changes.pending != 5 {
		t.Errorf("%d changes pending, want 5", p.changes.pending)
	}
}

// Events name the Services a partial sync reads: a Service's own key, a
// slice's Service, both Services of a slice that moved, and a Node makes
// everything dirty.
func TestEventsMarkTheServicesAPartialSyncReads(t *testing.T) {
	p := &proxier{changes: changes{gauge: newMetrics().pendingChanges, dirty: map[types.NamespacedName]bool{}}, runner: idleRunner()}
	h := p.eventHandler()
	h.OnAdd(&serviceRecord{recordMeta: recordMeta{namespace: "ns", name: "a"}}, false)
	h.OnUpdate(&sliceRecord{recordMeta: recordMeta{namespace: "ns", name: "s1"}, service: "b"},
		&sliceRecord{recordMeta: recordMeta{namespace: "ns", name: "s1"}, service: "c"})
	h.OnDelete(cache.DeletedFinalStateUnknown{Key: "ns/s2", Obj: &sliceRecord{recordMeta: recordMeta{namespace: "ns", name: "s2"}, service: "d"}})
	h.OnAdd(&sliceRecord{recordMeta: recordMeta{namespace: "ns", name: "s3"}}, false) // no Service
	want := map[types.NamespacedName]bool{nsName("ns", "a"): true, nsName("ns", "b"): true, nsName("ns", "c"): true, nsName("ns", "d"): true}
	if !maps.Equal(p.changes.dirty, want) {
		t.Errorf("dirty %v, want %v", p.changes.dirty, want)
	}
	self := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: p.cfg.NodeName}}
	before := nodeview.Record(self, nodeKeep)
	self.Labels = map[string]string{v1.LabelTopologyZone: "z2"}
	p.nodeHandler().OnUpdate(before, before) // a heartbeat: nothing the proxy reads
	if p.changes.dirty == nil {
		t.Errorf("after a Node update that changed nothing the proxy reads, everything is dirty")
	}
	p.nodeHandler().OnUpdate(before, nodeview.Record(self, nodeKeep))
	if p.changes.dirty != nil {
		t.Errorf("after a Node event dirty is %v, want nil (everything)", p.changes.dirty)
	}
}

// idleRunner takes requests and never runs.
func idleRunner() *runner.Runner {
	return runner.New(func(context.Context, bool) error { return nil }, runner.Options{})
}
