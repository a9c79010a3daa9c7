package endpointslice

import (
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	esutil "k8s.io/endpointslice/util"
)

// Narrowing a sync to the slices whose pods changed.
//
// The library's planner hashes every endpoint of a Service with go-spew on
// every sync: 21 µs an endpoint, 21 ms for a Service of 1,000 pods
// (BenchmarkPlanSteadyState), however few of them changed. When a sync
// finds that, since the last sync of the Service, only pods whose
// endpoints stay in their slices changed (a readiness flip, a restart),
// the planner gets just those pods and the slices holding them, each cut
// down to those pods' endpoints; what it writes of a cut slice is put back
// into the whole slice (splice.go). Its answer is then the one it would
// give on everything: with no endpoint to add or remove, it decides each
// slice from that slice's own endpoints (reconcileByPortMapping, step 1,
// and nothing after it), endpoint by endpoint in the slice's order, and
// every other slice and endpoint was already its answer for the state the
// last sync saw, which has not changed for them. Cut down, a flip in a
// slice of 100 endpoints hashes 2 endpoints, not 200.

// lastSync is what the last successful sync of a Service saw.
type lastSync struct {
	serviceRV string
	nodes     uint64 // nodeEpoch at that sync
	pods      map[string]podSeen
	slices    map[types.UID]int64 // generation by slice
}

// podSeen is a pod as a sync saw it: its resourceVersion, and what decides
// whether and where its endpoint is published. While that stays, a change
// of the pod can only change its endpoint in place.
type podSeen struct {
	rv        string
	placement placement
}

type placement struct {
	included bool // esutil.ShouldPodBeInEndpoints
	ips      string
	node     string
}

func placementOf(p *corev1.Pod) placement {
	ips := make([]string, len(p.Status.PodIPs))
	for i, ip := range p.Status.PodIPs {
		ips[i] = ip.IP
	}
	return placement{esutil.ShouldPodBeInEndpoints(p, true), strings.Join(ips, ","), p.Spec.NodeName}
}

// recordSync returns what a sync of svc saw, for the next one.
func recordSync(svc *corev1.Service, nodes uint64, pods []*corev1.Pod, slices []*discovery.EndpointSlice) *lastSync {
	l := &lastSync{serviceRV: svc.ResourceVersion, nodes: nodes, pods: make(map[string]podSeen, len(pods))}
	for _, p := range pods {
		l.pods[p.Name] = podSeen{p.ResourceVersion, placementOf(p)}
	}
	l.slices = sliceGenerations(slices)
	return l
}

// update records a narrowed sync: the pods that changed, and the slices
// it saw.
func (l *lastSync) update(changed []*corev1.Pod, slices []*discovery.EndpointSlice) {
	for _, p := range changed {
		l.pods[p.Name] = podSeen{p.ResourceVersion, placementOf(p)}
	}
	l.slices = sliceGenerations(slices)
}

func sliceGenerations(slices []*discovery.EndpointSlice) map[types.UID]int64 {
	out := make(map[types.UID]int64, len(slices))
	for _, s := range slices {
		out[s.UID] = s.Generation
	}
	return out
}

// narrowed is a sync narrowed by narrow: the planner's input, the whole
// slice each of its cut slices was cut from, and the pods that changed
// since the last sync (to be recorded once it succeeded).
type narrowed struct {
	pods    []*corev1.Pod
	slices  []*discovery.EndpointSlice
	cuts    map[string]cut // by slice name
	changed []*corev1.Pod
}

// cut is a slice cut down to some of its endpoints: the whole slice, and
// the place in it of each endpoint the cut holds.
type cut struct {
	whole *discovery.EndpointSlice
	at    []int
}

// narrow returns the part of a sync of svc the planner has to see, given
// the last successful sync; ok is false when it must see everything.
// written reports whether a slice is at a generation this controller wrote
// (so a slice the last sync updated or created is still as planned).
// An object without a resourceVersion (not from the API server) always
// counts as changed.
func narrow(last *lastSync, svc *corev1.Service, nodes uint64, pods []*corev1.Pod, slices []*discovery.EndpointSlice, written func(*discovery.EndpointSlice) bool) (n narrowed, ok bool) {
	// Topology hints spread a Service's endpoints over zones by counting
	// all of them; with two families a pod has an endpoint in each, so its
	// slices come in pairs the planner must see together.
	if last == nil || svc.ResourceVersion == "" || svc.ResourceVersion != last.serviceRV || nodes != last.nodes ||
		len(svc.Spec.IPFamilies) != 1 || topologyHints(svc) || len(pods) != len(last.pods) {
		return narrowed{}, false
	}
	dirty := map[string]bool{}
	for _, p := range pods {
		seen, found := last.pods[p.Name]
		switch {
		case !found:
			return narrowed{}, false // a pod joined (and, by the count, another left)
		case p.ResourceVersion != "" && p.ResourceVersion == seen.rv:
		case placementOf(p) != seen.placement:
			return narrowed{}, false
		default:
			dirty[p.Name] = true
			n.changed = append(n.changed, p)
		}
	}
	present := 0
	for _, s := range slices {
		if g, found := last.slices[s.UID]; found {
			present++
			if g == s.Generation {
				continue
			}
		}
		if !written(s) {
			return narrowed{}, false // changed by someone else
		}
	}
	if present != len(last.slices) {
		return narrowed{}, false // a slice went away
	}
	members := map[string]bool{}
	for _, s := range slices {
		c := cut{whole: s}
		for i, e := range s.Endpoints {
			if e.TargetRef != nil && dirty[e.TargetRef.Name] {
				c.at = append(c.at, i)
				members[e.TargetRef.Name] = true
			}
		}
		if len(c.at) == 0 {
			continue
		}
		part := *s
		part.Endpoints = make([]discovery.Endpoint, len(c.at))
		for j, i := range c.at {
			part.Endpoints[j] = s.Endpoints[i]
		}
		n.slices = append(n.slices, &part)
		if n.cuts == nil {
			n.cuts = map[string]cut{}
		}
		n.cuts[s.Name] = c
	}
	for _, p := range n.changed {
		if members[p.Name] {
			n.pods = append(n.pods, p)
		}
	}
	return n, true
}

// topologyHints reports whether svc asks for topology-aware hints
// (service.kubernetes.io/topology-mode or its deprecated annotation), which
// the planner computes over all of the Service's endpoints.
func topologyHints(svc *corev1.Service) bool {
	_, mode := svc.Annotations[corev1.AnnotationTopologyMode]
	_, old := svc.Annotations[corev1.DeprecatedAnnotationTopologyAwareHints]
	return mode || old
}

// lastSyncs holds the lastSync of each Service key. A key is synced by one
// worker at a time, so only the map needs the lock.
type lastSyncs struct {
	mu sync.Mutex
	m  map[string]*lastSync
}

func (l *lastSyncs) get(key string) *lastSync {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.m[key]
}

func (l *lastSyncs) set(key string, s *lastSync) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[string]*lastSync{}
	}
	if s == nil {
		delete(l.m, key)
		return
	}
	l.m[key] = s
}
