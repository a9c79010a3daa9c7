package proxy

import (
	"reflect"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/netplane/netplane/nodeview"
)

// changes is what the informers reported since the last sync: how many
// changes wait (netplane_proxy_pending_changes), the trigger times of slice
// changes (the network programming latency) and which Services they name
// (what a partial sync reads).
type changes struct {
	gauge   prometheus.Gauge // pending changes
	started time.Time        // earlier trigger times are not this proxier's latency
	request func()           // asks for a sync

	mu       sync.Mutex
	pending  int         // changes not yet programmed
	triggers []time.Time // endpoint change trigger times not yet programmed
	// dirty names the Services changed since the last sync; nil means
	// anything may have (before the first sync, after a Node event or a
	// failed sync).
	dirty map[types.NamespacedName]bool
}

// record notes a change from old (nil if unknown) to obj: the Services
// both name are dirty (a slice may move to another Service).
func (c *changes) record(old, obj any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.markDirty(old)
	c.markDirty(obj)
	c.pending++
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	// As kube-proxy: a deleted slice's trigger time counts too, and one
	// from before the proxier started (the initial list's) does not.
	if s, ok := obj.(*sliceRecord); ok && s.trigger.After(c.started) {
		c.triggers = append(c.triggers, s.trigger)
	}
	c.gauge.Set(float64(c.pending))
}

// markDirty notes the Service obj is or belongs to; anything else (a
// Node) makes everything dirty. Called with mu held.
func (c *changes) markDirty(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	switch o := obj.(type) {
	case nil:
	case *serviceRecord:
		if c.dirty != nil {
			c.dirty[o.key()] = true
		}
	case *sliceRecord:
		if c.dirty != nil && o.service != "" {
			c.dirty[o.serviceKey()] = true
		}
	default:
		c.dirty = nil
	}
}

// take hands a sync what changed and starts counting anew; changes that
// arrive meanwhile wait for the next sync.
func (c *changes) take() (triggers []time.Time, dirty map[types.NamespacedName]bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	triggers, dirty = c.triggers, c.dirty
	c.triggers, c.pending = nil, 0
	c.dirty = map[types.NamespacedName]bool{}
	c.gauge.Set(0)
	return triggers, dirty
}

// readAll makes the next sync read every Service.
func (c *changes) readAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dirty = nil
}

// failed gives the trigger times of a sync that failed back, for its
// retry, which reads every Service.
func (c *changes) failed(triggers []time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dirty = nil // the retry is a full sync anyway
	c.triggers = append(c.triggers, triggers...)
}

// changed records a change and asks for a sync.
func (c *changes) changed(obj any) { c.changedFrom(nil, obj) }

// changedFrom records a change from old to obj and asks for a sync.
func (c *changes) changedFrom(old, obj any) {
	c.record(old, obj)
	c.request()
}

// eventHandler feeds Service and EndpointSlice events in.
func (c *changes) eventHandler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    c.changed,
		UpdateFunc: c.changedFrom,
		DeleteFunc: c.changed,
	}
}

// nodeHandler feeds in the Node events that are relevant (thisNode), not
// kubelet heartbeats.
func (c *changes) nodeHandler(relevant func(old, cur *nodeview.Node) bool) cache.ResourceEventHandler {
	is := func(old, cur any) bool { return relevant(nodeview.RecordOf(old), nodeview.RecordOf(cur)) }
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if is(nil, obj) {
				c.changed(obj)
			}
		},
		UpdateFunc: func(old, obj any) {
			if is(old, obj) && !reflect.DeepEqual(old, obj) {
				c.changedFrom(old, obj)
			}
		},
		DeleteFunc: func(obj any) {
			if is(obj, nil) {
				c.changed(obj)
			}
		},
	}
}
