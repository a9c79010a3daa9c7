package proxy

import (
	"net/netip"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// This file reduces Services and EndpointSlices to the few facts the rules
// depend on: one servicePort per (Service, port) and its endpoints.

// defaultAffinityTimeout is the ClientIP affinity timeout when the Service
// does not give one (the API's default, 3 hours).
const defaultAffinityTimeout = 10800 * time.Second

// servicePort is one port of one Service, with only what the proxy needs.
type servicePort struct {
	Service             types.NamespacedName
	Name                string // the port's name, "" for a single unnamed port
	Protocol            v1.Protocol
	Port                uint16
	NodePort            uint16
	ClusterIPs          []netip.Addr
	ExternalIPs         []netip.Addr // spec.externalIPs
	LoadBalancer        []netip.Addr // status ingress IPs in VIP mode
	SourceRanges        []netip.Prefix
	ExternalLocal       bool          // externalTrafficPolicy Local (only when externally reachable)
	InternalLocal       bool          // internalTrafficPolicy Local
	Affinity            time.Duration // ClientIP affinity timeout; 0 means none
	HealthCheckNodePort uint16
}

// externallyAccessible: NodePort, externalIPs or load-balancer IPs.
func (sp *servicePort) externallyAccessible() bool {
	return sp.NodePort != 0 || len(sp.ExternalIPs) > 0 || len(sp.LoadBalancer) > 0
}

func (sp *servicePort) usesClusterEndpoints() bool {
	return !sp.InternalLocal || (sp.externallyAccessible() && !sp.ExternalLocal)
}

func (sp *servicePort) usesLocalEndpoints() bool {
	return sp.InternalLocal || (sp.externallyAccessible() && sp.ExternalLocal)
}

// String is "namespace/name/proto/portname", the readable part of chain names.
func (sp *servicePort) String() string {
	return sp.Service.Namespace + "/" + sp.Service.Name + "/" + strings.ToLower(string(sp.Protocol)) + "/" + sp.Name
}

// endpoint is one address serving a servicePort.
type endpoint struct {
	Addr        netip.Addr
	Port        uint16
	Ready       bool
	Serving     bool
	Terminating bool
	Local       bool
	Remote      bool // on another, named node: it cannot hairpin through this one's ClusterIPs
	ZoneHints   []string
	NodeHints   []string
}

func (e endpoint) addrPort() netip.AddrPort { return netip.AddrPortFrom(e.Addr, e.Port) }

// servicePorts returns the proxied ports of svc. Headless and ExternalName
// Services, and ports of unknown protocols, get none.
func servicePorts(svc *v1.Service) []servicePort {
	if svc.Spec.Type == v1.ServiceTypeExternalName || svc.Spec.ClusterIP == v1.ClusterIPNone || svc.Spec.ClusterIP == "" {
		return nil
	}
	base := servicePort{
		Service:       types.NamespacedName{Namespace: intern(svc.Namespace), Name: svc.Name},
		ClusterIPs:    parseAddrs(svc.Spec.ClusterIPs),
		ExternalIPs:   parseAddrs(svc.Spec.ExternalIPs),
		InternalLocal: svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == v1.ServiceInternalTrafficPolicyLocal,
	}
	if len(base.ClusterIPs) == 0 {
		base.ClusterIPs = parseAddrs([]string{svc.Spec.ClusterIP})
	}
	if svc.Spec.Type == v1.ServiceTypeLoadBalancer {
		for _, ing := range svc.Status.LoadBalancer.Ingress {
			if ing.IPMode != nil && *ing.IPMode == v1.LoadBalancerIPModeProxy {
				continue // the load balancer proxies: traffic arrives for the node, not the VIP
			}
			base.LoadBalancer = append(base.LoadBalancer, parseAddrs([]string{ing.IP})...)
		}
		base.SourceRanges = parsePrefixes(svc.Spec.LoadBalancerSourceRanges)
	}
	if svc.Spec.SessionAffinity == v1.ServiceAffinityClientIP {
		base.Affinity = defaultAffinityTimeout
		if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			base.Affinity = time.Duration(*c.ClientIP.TimeoutSeconds) * time.Second
		}
	}
	var out []servicePort
	for _, p := range svc.Spec.Ports {
		if p.Protocol != v1.ProtocolTCP && p.Protocol != v1.ProtocolUDP && p.Protocol != v1.ProtocolSCTP {
			continue
		}
		sp := base
		sp.Name, sp.Protocol, sp.Port = p.Name, protocol(p.Protocol), uint16(p.Port)
		if svc.Spec.Type == v1.ServiceTypeNodePort || svc.Spec.Type == v1.ServiceTypeLoadBalancer {
			sp.NodePort = uint16(p.NodePort)
		}
		sp.ExternalLocal = sp.externallyAccessible() && svc.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal
		if sp.ExternalLocal {
			sp.HealthCheckNodePort = uint16(svc.Spec.HealthCheckNodePort)
		}
		out = append(out, sp)
	}
	return out
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

func parseAddrs(ss []string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		if a, err := netip.ParseAddr(strings.TrimSpace(s)); err == nil {
			out = append(out, a.Unmap())
		} else if a, ok := parseLeadingZeros(s); ok {
			out = append(out, a)
		}
	}
	return out
}

func parsePrefixes(ss []string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		s = strings.TrimSpace(s)
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Masked())
			continue
		}
		addr, bits, ok := strings.Cut(s, "/")
		if a, okA := parseLeadingZeros(addr); ok && okA {
			if p, err := netip.ParsePrefix(a.String() + "/" + bits); err == nil {
				out = append(out, p.Masked())
			}
		}
	}
	return out
}

// parseLeadingZeros accepts IPv4 addresses with leading zeros ("010.0.0.1"),
// which older API servers stored and which mean decimal, as kube-proxy does.
func parseLeadingZeros(s string) (netip.Addr, bool) {
	parts := strings.Split(strings.TrimSpace(s), ".")
	if len(parts) != 4 {
		return netip.Addr{}, false
	}
	for i, p := range parts {
		p = strings.TrimLeft(p, "0")
		if p == "" {
			p = "0"
		}
		parts[i] = p
	}
	a, err := netip.ParseAddr(strings.Join(parts, "."))
	return a, err == nil
}
