package endpointslice

import (
	"context"
	"slices"
	"sync"

	"k8s.io/apimachinery/pkg/labels"
	esutil "k8s.io/endpointslice/util"
)

// podChange is what a Pod event means for Service membership, reduced to a
// comparable value so that the burst of events a rollout or a readiness
// wave causes (many pods with the same labels) collapses into one entry.
// Labels are in labels.Set's canonical "k=v,k=v" form; label keys and values
// cannot hold ',' or '='.
type podChange struct {
	namespace string
	labels    string
	// labelsChanged: oldLabels holds the labels before an update, and
	// podChanged says whether the endpoint itself changed too (then every
	// Service of either label set is affected, else only those the pod
	// joined or left).
	labelsChanged bool
	oldLabels     string
	podChanged    bool
}

// changeOf reduces a Pod event (old is nil for an add, cur for a delete) to
// the podChange it implies; ok is false when no Service can be affected
// (resyncs, status changes that do not touch endpoints).
func changeOf(old, cur any) (podChange, bool) {
	key := esutil.GetPodUpdateProjectionKey(old, cur)
	if key == nil {
		return podChange{}, false
	}
	c := podChange{namespace: key.Namespace, labels: key.Labels.String()}
	if key.OldLabels != nil {
		c.labelsChanged, c.oldLabels, c.podChanged = true, key.OldLabels.String(), key.PodChanged
	}
	return c, true
}

// projection turns a podChange back into the library's key, from which
// servicesToUpdate finds the Services to sync as kube-controller-manager
// does.
func (c podChange) projection() *esutil.PodProjectionKey {
	k := &esutil.PodProjectionKey{Namespace: c.namespace, Labels: parseLabels(c.labels)}
	if c.labelsChanged {
		k.OldLabels, k.PodChanged = parseLabels(c.oldLabels), c.podChanged
	}
	return k
}

func parseLabels(s string) labels.Set {
	out := labels.Set{}
	if s == "" {
		return out
	}
	// The canonical form of a label set is a valid selector of equalities.
	set, err := labels.ConvertSelectorToLabelsMap(s)
	if err != nil {
		return out
	}
	return set
}

// podChanges is the queue between the Pod informer and the worker that maps
// pods to Services: the event handler only records what changed, so a burst
// of pod events never waits on a scan of the namespace's Services. Equal
// changes pending at once are kept once; order is first come, first served.
type podChanges struct {
	mu      sync.Mutex
	pending map[podChange]struct{}
	order   []podChange
	busy    bool // a taken batch is being mapped
	wake    chan struct{}
}

func newPodChanges() *podChanges {
	return &podChanges{pending: map[podChange]struct{}{}, wake: make(chan struct{}, 1)}
}

func (q *podChanges) add(c podChange) {
	q.mu.Lock()
	if _, ok := q.pending[c]; !ok {
		q.pending[c] = struct{}{}
		q.order = append(q.order, c)
	}
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// take waits for changes and returns all of them, or nil once ctx ended.
// The caller calls done after handling them.
func (q *podChanges) take(ctx context.Context) []podChange {
	for {
		q.mu.Lock()
		if len(q.order) > 0 {
			batch := slices.Clone(q.order)
			q.order = q.order[:0]
			clear(q.pending)
			q.busy = true
			q.mu.Unlock()
			return batch
		}
		q.mu.Unlock()
		select {
		case <-q.wake:
		case <-ctx.Done():
			return nil
		}
	}
}

func (q *podChanges) done() {
	q.mu.Lock()
	q.busy = false
	q.mu.Unlock()
}

// idle reports whether no change is pending or being mapped.
func (q *podChanges) idle() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.order) == 0 && !q.busy
}
