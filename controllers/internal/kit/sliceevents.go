package kit

import (
	"sync"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/client-go/tools/cache"
	esutil "k8s.io/endpointslice/util"
)

// echoSettle is how long an update of a slice we wrote, at a generation
// the tracker does not know, waits before it counts as someone else's: the
// informer can deliver our own write before the write's response records
// its generation in the tracker. In a churn of 400 flips that happened to
// 45% of the writes, and each cost a sync with nothing to write.
const echoSettle = 100 * time.Millisecond

// SliceEvents returns the EndpointSlice event handlers of a controller
// whose slices carry managed-by value manager. Only changes that are not
// the controller's own writes echoing back reach enqueue: the tracker knows
// the generation of every slice it wrote and every deletion it made. (A
// deletion's event can still beat the library's note of it, which costs a
// sync with nothing to write; updates are the frequent case handled here.)
func SliceEvents(manager string, tracker *esutil.EndpointSliceTracker, enqueue func(*discoveryv1.EndpointSlice)) cache.ResourceEventHandlerFuncs {
	managed := func(s *discoveryv1.EndpointSlice) bool { return s.Labels[discoveryv1.LabelManagedBy] == manager }
	// changed queues s unless it is our own write. A slice the tracker
	// holds may be one whose response is still on its way: look again
	// after echoSettle. A slice it does not hold (a create's echo, a
	// slice seen at start) is queued at once, as before the settle.
	changed := func(s *discoveryv1.EndpointSlice) {
		switch {
		case !tracker.ShouldSync(s):
		case !tracker.Has(s):
			enqueue(s)
		default:
			time.AfterFunc(echoSettle, func() {
				if tracker.ShouldSync(s) {
					enqueue(s)
				}
			})
		}
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if s, ok := obj.(*discoveryv1.EndpointSlice); ok && managed(s) {
				changed(s)
			}
		},
		UpdateFunc: func(oldObj, curObj any) {
			old, ok1 := oldObj.(*discoveryv1.EndpointSlice)
			cur, ok2 := curObj.(*discoveryv1.EndpointSlice)
			if !ok1 || !ok2 {
				return
			}
			// A label edit does not bump the generation: check it explicitly.
			if old.Labels[discoveryv1.LabelServiceName] != cur.Labels[discoveryv1.LabelServiceName] {
				enqueue(old)
				enqueue(cur)
				return
			}
			switch {
			case managed(old) != managed(cur):
				enqueue(cur)
			case managed(cur):
				changed(cur)
			}
		},
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			s, ok := obj.(*discoveryv1.EndpointSlice)
			// HandleDeletion is false for a deletion we did not make.
			if ok && managed(s) && tracker.Has(s) && !tracker.HandleDeletion(s) {
				enqueue(s)
			}
		},
	}
}

// CacheWait holds the keys whose last sync found the slice cache behind the
// controller's own writes. kube-controller-manager retries such a key with
// its failure backoff (1 s, then 2 s, ...); here the slice informer queues
// it again the moment it delivers a slice of that key and Fresh says the
// cache caught up. The backoff retry stays as the fallback for an event that
// never comes.
type CacheWait struct {
	Queue *Queue
	// Fresh reports whether the cache shows every write made for key.
	Fresh func(key string) bool

	mu   sync.Mutex
	keys map[string]struct{}
}

// Park records that key waits for the cache. If the cache caught up while
// the sync ran, key is queued at once (the queue holds a key being synced
// and hands it out again when that sync is done).
func (w *CacheWait) Park(key string) {
	w.mu.Lock()
	if w.keys == nil {
		w.keys = map[string]struct{}{}
	}
	w.keys[key] = struct{}{}
	w.mu.Unlock()
	w.Observe(key)
}

// Observe is called for every change the slice informer delivers for key;
// it queues a parked key whose cache caught up.
func (w *CacheWait) Observe(key string) {
	w.mu.Lock()
	_, parked := w.keys[key]
	w.mu.Unlock()
	if !parked || !w.Fresh(key) {
		return
	}
	w.mu.Lock()
	_, parked = w.keys[key]
	delete(w.keys, key)
	w.mu.Unlock()
	if parked {
		w.Queue.Add(key)
	}
}

// Handler returns slice event handlers that pass the key (from keyOf) of
// every slice managed by manager to Observe, our own writes included:
// those are what a parked key waits for.
func (w *CacheWait) Handler(manager string, keyOf func(*discoveryv1.EndpointSlice) (string, bool)) cache.ResourceEventHandlerFuncs {
	observe := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		s, ok := obj.(*discoveryv1.EndpointSlice)
		if !ok || s.Labels[discoveryv1.LabelManagedBy] != manager {
			return
		}
		if key, ok := keyOf(s); ok {
			w.Observe(key)
		}
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    observe,
		UpdateFunc: func(_, cur any) { observe(cur) },
		DeleteFunc: observe,
	}
}
