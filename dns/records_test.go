package dns

import (
	"fmt"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"
)

// TestEndpointsOfSeveralSlicesMerge: a Service's slices are read in the
// order of their names, and an address in two of them is one endpoint
// with both slices' ports and the first hostname any of them gives.
func TestEndpointsOfSeveralSlicesMerge(t *testing.T) {
	dns := []discoveryv1.EndpointPort{{Name: ptr.To("dns"), Protocol: ptr.To(corev1.ProtocolUDP), Port: ptr.To[int32](53)}}
	v4 := discoveryv1.AddressTypeIPv4
	for _, c := range []struct {
		name   string
		slices []*discoveryv1.EndpointSlice
		want   string // each endpoint as host@addr:ports
	}{
		{"one address in two slices has both slices' ports",
			[]*discoveryv1.EndpointSlice{
				slice("ns", "b", "svc", v4, dns, ep{addr: "10.0.0.1", ready: true}),
				slice("ns", "a", "svc", v4, httpSlicePorts(), ep{addr: "10.0.0.1", ready: true}, ep{addr: "10.0.0.2", ready: true}),
			},
			"[10-0-0-1@10.0.0.1:[http/tcp/80 dns/udp/53] 10-0-0-2@10.0.0.2:[http/tcp/80]]"},
		{"a later slice's hostname names an address the first left unnamed",
			[]*discoveryv1.EndpointSlice{
				slice("ns", "a", "svc", v4, httpSlicePorts(), ep{addr: "10.0.0.1", ready: true}),
				slice("ns", "b", "svc", v4, httpSlicePorts(), ep{addr: "10.0.0.1", host: "web-0", ready: true}),
			},
			"[web-0@10.0.0.1:[http/tcp/80]]"},
		{"the first slice's hostname is kept",
			[]*discoveryv1.EndpointSlice{
				slice("ns", "b", "svc", v4, httpSlicePorts(), ep{addr: "10.0.0.1", host: "web-1", ready: true}),
				slice("ns", "a", "svc", v4, httpSlicePorts(), ep{addr: "10.0.0.1", host: "web-0", ready: true}),
				slice("ns", "c", "svc", v4, httpSlicePorts(), ep{addr: "10.0.0.1", ready: true}),
			},
			"[web-0@10.0.0.1:[http/tcp/80]]"},
		{"slices of distinct addresses are read in the order of their names",
			[]*discoveryv1.EndpointSlice{
				slice("ns", "b", "svc", v4, dns, ep{addr: "10.0.0.1", ready: true}),
				slice("ns", "a", "svc", v4, httpSlicePorts(), ep{addr: "10.0.0.3", ready: true}, ep{addr: "10.0.0.2", ready: true}),
			},
			"[10-0-0-2@10.0.0.2:[http/tcp/80] 10-0-0-3@10.0.0.3:[http/tcp/80] 10-0-0-1@10.0.0.1:[dns/udp/53]]"},
		{"unready endpoints and bad addresses are left out",
			[]*discoveryv1.EndpointSlice{
				slice("ns", "a", "svc", v4, httpSlicePorts(), ep{addr: "10.0.0.1"}, ep{addr: "not-an-address", ready: true}, ep{addr: "10.0.0.3", ready: true}),
			},
			"[10-0-0-3@10.0.0.3:[http/tcp/80]]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := buildService(headlessService("ns", "svc", httpPort()), c.slices)
			if got := endpointsText(s.eps); got != c.want {
				t.Errorf("endpoints %s, want %s", got, c.want)
			}
		})
	}
}

// TestAServiceSharesItsSlicesEndpoints: the index holds a slice's
// endpoints once, in the slice's record, unless the Service's slices share
// an address.
func TestAServiceSharesItsSlicesEndpoints(t *testing.T) {
	v4 := discoveryv1.AddressTypeIPv4
	a := sliceOf(slice("ns", "a", "svc", v4, httpSlicePorts(), ep{addr: "10.0.0.1", ready: true}))
	b := sliceOf(slice("ns", "b", "svc", v4, httpSlicePorts(), ep{addr: "10.0.0.2", ready: true}, ep{addr: "10.0.0.3", ready: true}))
	empty := sliceOf(slice("ns", "c", "svc", v4, httpSlicePorts(), ep{addr: "10.0.0.4"}))
	spec := serviceSpec(headlessService("ns", "svc", httpPort()))
	for _, c := range []struct {
		name   string
		slices []*sliceInfo
		shared bool
	}{
		{"one slice", []*sliceInfo{a}, true},
		{"two slices of distinct addresses and one without ready endpoints", []*sliceInfo{empty, b, a}, true},
		{"two slices of one address", []*sliceInfo{a, sliceOf(slice("ns", "d", "svc", v4, httpSlicePorts(), ep{addr: "10.0.0.1", ready: true}))}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := spec.withEndpoints(c.slices)
			shared := len(s.eps) > 0
			for _, l := range s.eps {
				shared = shared && len(l) > 0 && slices.ContainsFunc(c.slices, func(sl *sliceInfo) bool { return len(sl.eps) > 0 && &sl.eps[0] == &l[0] })
			}
			if shared != c.shared {
				t.Errorf("the Service's endpoint lists are the slices' own: %v, want %v", shared, c.shared)
			}
		})
	}
}

func endpointsText(eps endpoints) string {
	var out []string
	for e := range eps.all() {
		ports := make([]string, len(e.portList()))
		for j, p := range e.portList() {
			ports[j] = fmt.Sprintf("%s/%s/%d", p.name, p.proto, p.port)
		}
		out = append(out, fmt.Sprintf("%s@%s:%v", e.name(), e.addr, ports))
	}
	return fmt.Sprint(out)
}
