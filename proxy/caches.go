package proxy

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
)

// caches are the views' caches a sync reads Services and EndpointSlices
// from, as records (records.go).
type caches struct {
	services cache.Store   // of *serviceRecord
	slices   cache.Indexer // of *sliceRecord, indexed byService
}

// delta reads the dirty Services and their slices from the caches.
func (c caches) delta(dirty map[types.NamespacedName]bool) (map[types.NamespacedName]Change, error) {
	out := make(map[types.NamespacedName]Change, len(dirty))
	for name := range dirty {
		key := name.String() // the caches' key and the byService index's
		var ch Change
		o, ok, err := c.services.GetByKey(key)
		if err != nil {
			return nil, err
		}
		if ok {
			if ch.Svc, ok = o.(*serviceRecord); !ok {
				return nil, fmt.Errorf("a %T in the Service cache", o)
			}
		}
		objs, err := c.slices.ByIndex(byService, key)
		if err != nil {
			return nil, err
		}
		for _, o := range objs {
			s, ok := o.(*sliceRecord)
			if !ok {
				return nil, fmt.Errorf("a %T in the EndpointSlice cache", o)
			}
			ch.Slices = append(ch.Slices, s)
		}
		sortSlices(ch.Slices)
		out[name] = ch
	}
	return out, nil
}

// sortSlices orders a Service's slices by name: the caches list them in
// no order, and the model takes a different order for a change.
func sortSlices(ss []*sliceRecord) {
	if len(ss) > 1 {
		slices.SortFunc(ss, func(a, b *sliceRecord) int { return strings.Compare(a.name, b.name) })
	}
}

// input gathers the informer caches, with this node's facts.
func (c caches) input(node NodeFacts) (Input, error) {
	in := Input{Slices: map[types.NamespacedName][]*sliceRecord{}, Node: node}
	for _, o := range c.services.List() {
		s, ok := o.(*serviceRecord)
		if !ok {
			return Input{}, fmt.Errorf("a %T in the Service cache", o)
		}
		in.Services = append(in.Services, s)
	}
	for _, o := range c.slices.List() {
		s, ok := o.(*sliceRecord)
		if !ok {
			return Input{}, fmt.Errorf("a %T in the EndpointSlice cache", o)
		}
		if s.service != "" {
			in.Slices[s.serviceKey()] = append(in.Slices[s.serviceKey()], s)
		}
	}
	for _, ss := range in.Slices {
		sortSlices(ss)
	}
	return in, nil
}
