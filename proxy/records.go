package proxy

import (
	"net/netip"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/netplane/netplane/internal/intern"
)

// The proxy's views keep records, not API objects: a Service becomes
// its servicePorts and an EndpointSlice its ports and endpoints as they
// arrive (the views' Record, sync_informers.go), and the decoded object is
// garbage at once. At 10,000 Services that is a third of what even slimmed
// API objects took (proxy/README.md), and the model reads records directly.

// recordMeta is what client-go needs of a record: the name and namespace
// for its keys, the resourceVersion to tell an update from a resync.
type recordMeta struct {
	namespace, name, resourceVersion string
}

// GetObjectMeta makes records readable by meta.Accessor, and so by
// client-go's key functions and stores.
func (m *recordMeta) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Namespace: m.namespace, Name: m.name, ResourceVersion: m.resourceVersion}
}

func metaOf(o *metav1.ObjectMeta) recordMeta {
	return recordMeta{namespace: intern.String(o.Namespace), name: o.Name, resourceVersion: o.ResourceVersion}
}

// serviceRecord is a Service as the proxy keeps it. Records are never
// changed once made: a new object gives a new record, so pointer equality
// means "unchanged" (the model relies on it).
type serviceRecord struct {
	recordMeta
	ports []servicePort // none for headless and ExternalName Services
}

func (s *serviceRecord) key() types.NamespacedName {
	return types.NamespacedName{Namespace: s.namespace, Name: s.name}
}

// sliceRecord is an EndpointSlice as the proxy keeps it.
type sliceRecord struct {
	recordMeta
	service   string    // the kubernetes.io/service-name label; "" for none
	trigger   time.Time // the last-change-trigger-time annotation; zero if absent or malformed
	ports     []slicePortRecord
	endpoints []sliceEndpoint // none for an address type the proxy does not program
}

// serviceKey is the Service the slice belongs to (valid when service is set).
func (s *sliceRecord) serviceKey() types.NamespacedName {
	return types.NamespacedName{Namespace: s.namespace, Name: s.service}
}

// slicePortRecord is one port of a slice; port is 0 when it has no valid number.
type slicePortRecord struct {
	name     string
	protocol v1.Protocol
	port     uint16
}

// sliceEndpoint is one endpoint of a slice: its first address, the node it
// runs on, its conditions with kube-proxy's defaults, its hints.
type sliceEndpoint struct {
	addr                        netip.Addr
	node                        string
	hints                       *endpointHints // nil without hints
	ready, serving, terminating bool
}

type endpointHints struct{ zones, nodes []string }

// toRecord makes records: a Service or an EndpointSlice becomes its
// record; anything else, a record included, passes unchanged.
func toRecord(obj any) (any, error) {
	switch o := obj.(type) {
	case *v1.Service:
		return serviceRecordOf(o), nil
	case *discovery.EndpointSlice:
		return sliceRecordOf(o), nil
	}
	return obj, nil
}

func serviceRecordOf(svc *v1.Service) *serviceRecord {
	return &serviceRecord{recordMeta: metaOf(&svc.ObjectMeta), ports: servicePorts(svc)}
}

func sliceRecordOf(s *discovery.EndpointSlice) *sliceRecord {
	r := &sliceRecord{recordMeta: metaOf(&s.ObjectMeta), service: s.Labels[discovery.LabelServiceName]}
	if t, err := time.Parse(time.RFC3339, s.Annotations[v1.EndpointsLastChangeTriggerTime]); err == nil {
		r.trigger = t
	}
	for _, p := range s.Ports {
		rp := slicePortRecord{protocol: v1.ProtocolTCP}
		if p.Name != nil {
			rp.name = *p.Name
		}
		if p.Protocol != nil {
			rp.protocol = protocol(*p.Protocol)
		}
		if p.Port != nil && *p.Port > 0 && *p.Port < 65536 {
			rp.port = uint16(*p.Port)
		}
		r.ports = append(r.ports, rp)
	}
	if s.AddressType != discovery.AddressTypeIPv4 && s.AddressType != discovery.AddressTypeIPv6 {
		return r
	}
	r.endpoints = make([]sliceEndpoint, 0, len(s.Endpoints))
	for _, e := range s.Endpoints {
		if len(e.Addresses) == 0 {
			continue
		}
		addr, err := netip.ParseAddr(e.Addresses[0])
		if err != nil {
			continue
		}
		re := sliceEndpoint{addr: addr.Unmap()}
		// kube-proxy's reading: an absent ready or serving means true (the
		// API says an absent serving defers to ready; kube-proxy, whose
		// fallback to terminating endpoints we match, does not).
		re.ready = e.Conditions.Ready == nil || *e.Conditions.Ready
		re.serving = e.Conditions.Serving == nil || *e.Conditions.Serving
		re.terminating = e.Conditions.Terminating != nil && *e.Conditions.Terminating
		if e.NodeName != nil {
			re.node = intern.String(*e.NodeName)
		}
		if h := e.Hints; h != nil && (len(h.ForZones) > 0 || len(h.ForNodes) > 0) {
			re.hints = &endpointHints{}
			for _, z := range h.ForZones {
				re.hints.zones = append(re.hints.zones, intern.String(z.Name))
			}
			for _, n := range h.ForNodes {
				re.hints.nodes = append(re.hints.nodes, intern.String(n.Name))
			}
		}
		r.endpoints = append(r.endpoints, re)
	}
	return r
}

// endpointsFor collects the endpoints of sp from the Service's slices: the
// port is found by name in each slice (slices may disagree on the number),
// and an address listed twice is kept once, preferring a ready copy.
func endpointsFor(sp *servicePort, ss []*sliceRecord, nodeName string) []endpoint {
	n := 0
	for _, s := range ss {
		n += len(s.endpoints)
	}
	all := make([]endpoint, 0, n)
	for _, s := range ss {
		num, ok := slicePort(s, sp)
		if !ok {
			continue
		}
		for _, e := range s.endpoints {
			ep := endpoint{Addr: e.addr, Port: num, Ready: e.ready, Serving: e.serving, Terminating: e.terminating}
			ep.Local = e.node != "" && e.node == nodeName
			ep.Remote = e.node != "" && nodeName != "" && e.node != nodeName
			if e.hints != nil {
				ep.ZoneHints, ep.NodeHints = e.hints.zones, e.hints.nodes
			}
			all = append(all, ep)
		}
	}
	// Sorted by address, ready copies of an address first; then the first
	// copy of each address is kept.
	slices.SortStableFunc(all, func(a, b endpoint) int {
		if c := a.addrPort().Compare(b.addrPort()); c != 0 {
			return c
		}
		return cmpBool(b.Ready, a.Ready)
	})
	out := all[:0]
	for _, ep := range all {
		if len(out) == 0 || ep.addrPort() != out[len(out)-1].addrPort() {
			out = append(out, ep)
		}
	}
	return out
}

// cmpBool orders false before true.
func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

func slicePort(s *sliceRecord, sp *servicePort) (uint16, bool) {
	for _, p := range s.ports {
		if p.name == sp.Name && p.protocol == sp.Protocol && p.port != 0 {
			return p.port, true
		}
	}
	return 0, false
}
