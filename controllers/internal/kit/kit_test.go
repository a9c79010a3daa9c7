package kit

import (
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestCacheWaitQueuesAParkedKeyOnceTheCacheCaughtUp walks a key through
// parking and slice events; queued counts the keys handed to the queue.
func TestCacheWaitQueuesAParkedKeyOnceTheCacheCaughtUp(t *testing.T) {
	steps := []struct {
		do         string // park, observe or an unmanaged/other-key event
		fresh      bool
		wantQueued int
	}{
		{do: "observe", fresh: true, wantQueued: 0},  // not parked: nothing to do
		{do: "park", fresh: false, wantQueued: 0},    // stale: waits
		{do: "observe", fresh: false, wantQueued: 0}, // an echo of one write of several
		{do: "unmanaged", fresh: true, wantQueued: 0},
		{do: "other key", fresh: true, wantQueued: 0},
		{do: "observe", fresh: true, wantQueued: 1}, // caught up: queued
		{do: "observe", fresh: true, wantQueued: 1}, // no longer parked
		{do: "park", fresh: true, wantQueued: 2},    // caught up while the sync ran
	}
	q := NewQueue("test")
	defer q.ShutDown()
	fresh := false
	w := &CacheWait{Queue: q, Fresh: func(string) bool { return fresh }}
	h := w.Handler("us", func(s *discoveryv1.EndpointSlice) (string, bool) {
		return s.Namespace + "/" + s.Labels[discoveryv1.LabelServiceName], true
	})
	slice := func(svc, manager string) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: svc + "-x",
			Labels: map[string]string{discoveryv1.LabelServiceName: svc, discoveryv1.LabelManagedBy: manager}}}
	}
	queued := 0
	for i, st := range steps {
		fresh = st.fresh
		switch st.do {
		case "park":
			w.Park("ns/a")
		case "observe":
			h.OnUpdate(nil, slice("a", "us"))
		case "unmanaged":
			h.OnAdd(slice("a", "someone-else"), false)
		case "other key":
			h.OnDelete(slice("b", "us"))
		}
		for q.Len() > 0 {
			k, _ := q.Get()
			if k != "ns/a" {
				t.Errorf("step %d queued %q", i, k)
			}
			q.Done(k)
			queued++
		}
		if queued != st.wantQueued {
			t.Fatalf("step %d (%s, fresh=%v): %d queued in all, want %d", i, st.do, st.fresh, queued, st.wantQueued)
		}
	}
}
