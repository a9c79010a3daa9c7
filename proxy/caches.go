package proxy

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// delta reads the dirty Services and their slices from the caches.
func (p *proxier) delta(dirty map[types.NamespacedName]bool) (map[types.NamespacedName]Change, error) {
	out := make(map[types.NamespacedName]Change, len(dirty))
	for name := range dirty {
		key := name.String() // the caches' key and the byService index's
		var c Change
		o, ok, err := p.services.GetByKey(key)
		if err != nil {
			return nil, err
		}
		if ok {
			if c.Svc, ok = o.(*serviceRecord); !ok {
				return nil, fmt.Errorf("a %T in the Service cache", o)
			}
		}
		objs, err := p.slices.ByIndex(byService, key)
		if err != nil {
			return nil, err
		}
		for _, o := range objs {
			s, ok := o.(*sliceRecord)
			if !ok {
				return nil, fmt.Errorf("a %T in the EndpointSlice cache", o)
			}
			c.Slices = append(c.Slices, s)
		}
		sortSlices(c.Slices)
		out[name] = c
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
func (p *proxier) input(node NodeFacts) (Input, error) {
	in := Input{Slices: map[types.NamespacedName][]*sliceRecord{}, Node: node}
	for _, o := range p.services.List() {
		s, ok := o.(*serviceRecord)
		if !ok {
			return Input{}, fmt.Errorf("a %T in the Service cache", o)
		}
		in.Services = append(in.Services, s)
	}
	for _, o := range p.slices.List() {
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
