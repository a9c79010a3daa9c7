package proxy

import (
	"net/netip"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/netplane/netplane/nft"
	"github.com/netplane/netplane/nodeview"
)

// This file answers, for a reader outside the node role (netplane
// explain), which endpoints one node's rules send a Service port's traffic
// to, with the functions that build those rules.

// PortChoice is one port of a Service as one node's rules treat it.
type PortChoice struct {
	Name          string // "" for a single unnamed port
	Protocol      v1.Protocol
	Port          uint16
	NodePort      uint16
	ClusterIPs    []netip.Addr
	ExternalIPs   []netip.Addr // spec.externalIPs and load-balancer VIPs
	InternalLocal bool
	ExternalLocal bool
	Affinity      time.Duration // ClientIP affinity timeout; 0: none
	// Endpoints are every endpoint of the port, one per address, sorted.
	Endpoints []ChosenEndpoint
	// Internal are the endpoints ClusterIP traffic goes to, External those
	// of NodePort, externalIPs and load-balancer traffic from outside the
	// cluster. Empty with Any: the node drops; without Any: it rejects.
	Internal, External []netip.AddrPort
	// Cluster are the endpoints of the node's Cluster-policy chain (after
	// topology; none when no traffic policy is Cluster): ExternalFor says
	// who reaches them.
	Cluster []netip.AddrPort
	Any     bool
	// Fallback: no endpoint is ready, the serving terminating ones are used.
	Fallback bool
}

// ChosenEndpoint is an endpoint with the conditions the choice read.
type ChosenEndpoint struct {
	Addr                        netip.AddrPort
	Ready, Serving, Terminating bool
	Local                       bool // on the node the choice is made for
	ZoneHints, NodeHints        []string
}

// Choose returns the ports of svc as node's rules treat them, from its
// EndpointSlices; none for a headless or ExternalName Service.
func Choose(svc *v1.Service, slices []*discovery.EndpointSlice, node, zone string) []PortChoice {
	rec := serviceRecordOf(svc)
	recs := make([]*sliceRecord, len(slices))
	for i, s := range slices {
		recs[i] = sliceRecordOf(s)
	}
	out := make([]PortChoice, 0, len(rec.ports))
	for i := range rec.ports {
		sp := &rec.ports[i]
		eps := endpointsFor(sp, recs, node)
		cat := categorize(sp, eps, node, zone)
		c := PortChoice{Name: sp.Name, Protocol: sp.Protocol, Port: sp.Port, NodePort: sp.NodePort,
			ClusterIPs: sp.ClusterIPs, ExternalIPs: append(append([]netip.Addr{}, sp.ExternalIPs...), sp.LoadBalancer...),
			InternalLocal: sp.InternalLocal, ExternalLocal: sp.ExternalLocal, Affinity: sp.Affinity, Any: cat.Any}
		for _, e := range eps {
			c.Endpoints = append(c.Endpoints, ChosenEndpoint{Addr: e.addrPort(), Ready: e.Ready, Serving: e.Serving,
				Terminating: e.Terminating, Local: e.Local, ZoneHints: e.ZoneHints, NodeHints: e.NodeHints})
			c.Fallback = c.Fallback || e.Ready
		}
		c.Fallback = !c.Fallback && cat.Any
		internal, external := cat.Cluster, cat.Cluster
		if sp.InternalLocal {
			internal = cat.Local
		}
		if sp.ExternalLocal {
			external = cat.Local
		}
		for _, e := range cat.Cluster {
			c.Cluster = append(c.Cluster, e.addrPort())
		}
		for _, e := range internal {
			c.Internal = append(c.Internal, e.addrPort())
		}
		for _, e := range external {
			c.External = append(c.External, e.addrPort())
		}
		out = append(out, c)
	}
	return out
}

// ExternalFor are the endpoints the node's external chain (externalChain)
// sends NodePort, externalIP and load-balancer traffic to from a source,
// and whether it masquerades it: with Cluster policy every source goes to
// External, masqueraded; with Local policy the node's pods (pod) and the
// node itself (local, masqueraded) go to the Cluster chain's endpoints
// when the node has one, as if hairpinned, and other clients only to the
// local ones, keeping their address.
func (c PortChoice) ExternalFor(pod, local bool) (eps []netip.AddrPort, masquerade bool) {
	switch {
	case !c.ExternalLocal:
		return c.External, true
	case (pod || local) && len(c.Cluster) > 0:
		return c.Cluster, local
	}
	return c.External, local
}

// ServiceTables are the tables of one node's rules for svc alone: what
// the node's tables must hold of it, by family (to compare with a kernel).
func ServiceTables(svc *v1.Service, slices []*discovery.EndpointSlice, node NodeFacts) map[nodeview.Family]*nft.Table {
	recs := make([]*sliceRecord, len(slices))
	for i, s := range slices {
		recs[i] = sliceRecordOf(s)
	}
	rec := serviceRecordOf(svc)
	key := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	return Build(Input{Services: []*serviceRecord{rec}, Slices: map[types.NamespacedName][]*sliceRecord{key: recs}, Node: node}).Tables
}

// ProtocolNumber is the IP protocol of an API protocol, TCP when empty.
func ProtocolNumber(p v1.Protocol) uint8 { return protoNumber(p) }
