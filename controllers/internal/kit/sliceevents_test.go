package kit

import (
	"sync"
	"testing"
	"testing/synctest"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	esutil "k8s.io/endpointslice/util"
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
	defer q.Current().ShutDown()
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
			k, _ := q.Current().Get()
			if k != "ns/a" {
				t.Errorf("step %d queued %q", i, k)
			}
			q.Current().Done(k)
			queued++
		}
		if queued != st.wantQueued {
			t.Fatalf("step %d (%s, fresh=%v): %d queued in all, want %d", i, st.do, st.fresh, queued, st.wantQueued)
		}
	}
}

// TestSliceEventsTellOurEchoFromForeignChanges: an update whose generation
// the tracker learns within echoSettle (our write's response arriving
// after its watch event) queues nothing; a foreign edit, a slice the
// tracker does not hold and a change of manager are queued.
func TestSliceEventsTellOurEchoFromForeignChanges(t *testing.T) {
	slice := func(gen int64, manager string) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a-x", UID: "u1", Generation: gen,
			Labels: map[string]string{discoveryv1.LabelServiceName: "a", discoveryv1.LabelManagedBy: manager}}}
	}
	cases := []struct {
		name    string
		tracked int64 // generation the tracker holds before the event; 0: none
		event   *discoveryv1.EndpointSlice
		old     *discoveryv1.EndpointSlice // nil: an add
		learn   int64                      // generation the tracker learns right after the event; 0: none
		want    int
	}{
		{"our echo before its response", 1, slice(2, "us"), slice(1, "us"), 2, 0},
		{"our echo after its response", 2, slice(2, "us"), slice(1, "us"), 0, 0},
		{"a foreign edit", 2, slice(3, "us"), slice(2, "us"), 0, 1},
		{"a foreign edit while our write is out", 2, slice(4, "us"), slice(3, "us"), 3, 1},
		{"a slice the tracker does not hold", 0, slice(1, "us"), nil, 0, 1},
		{"taken over from another manager", 0, slice(2, "us"), slice(1, "them"), 0, 1},
		{"someone else's slice", 0, slice(2, "them"), slice(1, "them"), 0, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			// In a synctest bubble the clock moves only when every
			// goroutine waits, so the look-again after echoSettle runs at
			// its time however loaded the machine is.
			synctest.Test(t, func(t *testing.T) {
				tracker := esutil.NewEndpointSliceTracker()
				if c.tracked > 0 {
					tracker.Update(slice(c.tracked, "us"))
				}
				var mu sync.Mutex
				queued := 0
				h := SliceEvents("us", tracker, func(*discoveryv1.EndpointSlice) { mu.Lock(); queued++; mu.Unlock() })
				if c.old == nil {
					h.OnAdd(c.event, false)
				} else {
					h.OnUpdate(c.old, c.event)
				}
				if c.learn > 0 {
					tracker.Update(slice(c.learn, "us"))
				}
				time.Sleep(2 * echoSettle) // past every look-again
				synctest.Wait()            // which has run to its end
				mu.Lock()
				defer mu.Unlock()
				if queued != c.want {
					t.Errorf("queued %d times, want %d", queued, c.want)
				}
			})
		})
	}
}
