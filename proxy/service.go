package proxy

import (
	"net/netip"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/netplane/netplane/internal/intern"
)

// This file reduces Services and EndpointSlices to the few facts the rules
// depend on: one servicePort per (Service, port) and its endpoints (which
// endpointsFor collects from the slices' records).

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
		Service:       types.NamespacedName{Namespace: intern.String(svc.Namespace), Name: svc.Name},
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

// protocol is p as one of the package's constants, so records share them.
func protocol(p v1.Protocol) v1.Protocol {
	for _, known := range []v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP} {
		if p == known {
			return known
		}
	}
	return p
}
