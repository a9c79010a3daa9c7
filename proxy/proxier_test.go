package proxy

import (
	"maps"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/netplane/netplane/nodeview"
)

// TestTriggerTimesCountOnlyAfterStart: network programming latency is
// measured from a slice's last-change-trigger-time, as kube-proxy does:
// deletions (tombstones too) count, times from before the proxier started
// (the initial list's, maybe days old) do not.
func TestTriggerTimesCountOnlyAfterStart(t *testing.T) {
	start := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	c := &changes{gauge: newMetrics().pendingChanges, started: start, request: func() {}}
	at := func(d time.Duration) *sliceRecord { return &sliceRecord{trigger: start.Add(d)} }
	c.changed(at(-time.Hour))
	c.changed(&sliceRecord{})
	c.changed(&serviceRecord{})
	c.changed(at(time.Second))
	c.changed(cache.DeletedFinalStateUnknown{Key: "ns/e", Obj: at(2 * time.Second)})
	if want := []time.Time{start.Add(time.Second), start.Add(2 * time.Second)}; !slices.Equal(c.triggers, want) {
		t.Errorf("trigger times %v, want %v", c.triggers, want)
	}
	if c.pending != 5 {
		t.Errorf("%d changes pending, want 5", c.pending)
	}
}

// Events name the Services a partial sync reads: a Service's own key, a
// slice's Service, both Services of a slice that moved, and a Node makes
// everything dirty.
func TestEventsMarkTheServicesAPartialSyncReads(t *testing.T) {
	c := &changes{gauge: newMetrics().pendingChanges, dirty: map[types.NamespacedName]bool{}, request: func() {}}
	h := c.eventHandler()
	h.OnAdd(&serviceRecord{recordMeta: recordMeta{namespace: "ns", name: "a"}}, false)
	h.OnUpdate(&sliceRecord{recordMeta: recordMeta{namespace: "ns", name: "s1"}, service: "b"},
		&sliceRecord{recordMeta: recordMeta{namespace: "ns", name: "s1"}, service: "c"})
	h.OnDelete(cache.DeletedFinalStateUnknown{Key: "ns/s2", Obj: &sliceRecord{recordMeta: recordMeta{namespace: "ns", name: "s2"}, service: "d"}})
	h.OnAdd(&sliceRecord{recordMeta: recordMeta{namespace: "ns", name: "s3"}}, false) // no Service
	want := map[types.NamespacedName]bool{nsName("ns", "a"): true, nsName("ns", "b"): true, nsName("ns", "c"): true, nsName("ns", "d"): true}
	if !maps.Equal(c.dirty, want) {
		t.Errorf("dirty %v, want %v", c.dirty, want)
	}
	var node thisNode
	self := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node.cfg.NodeName}}
	before := nodeview.Record(self, nodeKeep)
	self.Labels = map[string]string{v1.LabelTopologyZone: "z2"}
	c.nodeHandler(node.relevant).OnUpdate(before, before) // a heartbeat: nothing the proxy reads
	if c.dirty == nil {
		t.Errorf("after a Node update that changed nothing the proxy reads, everything is dirty")
	}
	c.nodeHandler(node.relevant).OnUpdate(before, nodeview.Record(self, nodeKeep))
	if c.dirty != nil {
		t.Errorf("after a Node event dirty is %v, want nil (everything)", c.dirty)
	}
}
