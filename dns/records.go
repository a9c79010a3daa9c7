package dns

import (
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// svcKind says which record rules a Service follows.
type svcKind uint8

const (
	kindClusterIP svcKind = iota
	kindHeadless
	kindExternalName
)

// port is a service or endpoint port; name and proto are lowercase so a query
// matches them case-insensitively.
type port struct {
	name  string
	proto string
	port  int32
}

// endpoint is one ready address of a Service, merged across its slices.
type endpoint struct {
	host  string // the endpoint's name label: slice hostname or dashed IP
	addr  netip.Addr
	ports []port
}

// svcKey names a Service; lookups build it from query labels without
// allocating.
type svcKey struct{ ns, name string }

// service is everything DNS answers about one Service, computed once per
// change of the Service or one of its slices, never per query.
type service struct {
	key      svcKey
	kind     svcKind
	ips      []netip.Addr // ClusterIPs, kindClusterIP only
	external string       // lowercase FQDN, kindExternalName only
	ports    []port
	eps      []endpoint // ready only, one per address, sorted by address
}

// buildService computes a Service's records from the Service and the
// EndpointSlices labelled with its name, whoever manages them. It returns
// nil for a nil Service.
func buildService(svc *corev1.Service, sls []*discoveryv1.EndpointSlice) *service {
	infos := make([]*sliceInfo, len(sls))
	for i, sl := range sls {
		infos[i] = sliceOf(sl)
	}
	return serviceSpec(svc).withEndpoints(infos)
}

// serviceSpec is what a Service says of itself, without endpoints: all the
// informer cache keeps of it.
func serviceSpec(svc *corev1.Service) *service {
	if svc == nil {
		return nil
	}
	s := &service{key: svcKey{strings.ToLower(svc.Namespace), strings.ToLower(svc.Name)}}
	switch {
	case svc.Spec.Type == corev1.ServiceTypeExternalName:
		s.kind = kindExternalName
		s.external = strings.ToLower(strings.TrimSuffix(svc.Spec.ExternalName, ".")) + "."
		return s
	case svc.Spec.ClusterIP == corev1.ClusterIPNone:
		s.kind = kindHeadless
	default:
		s.kind = kindClusterIP
		s.ips = clusterIPs(svc)
	}
	for _, p := range svc.Spec.Ports {
		s.ports = append(s.ports, port{strings.ToLower(p.Name), strings.ToLower(string(p.Protocol)), p.Port})
	}
	return s
}

// withEndpoints is the spec s with the ready endpoints of its slices; an
// ExternalName Service has none. The spec and its slices are shared, never
// changed.
func (s *service) withEndpoints(sls []*sliceInfo) *service {
	if s == nil || s.kind == kindExternalName {
		return s
	}
	eps := mergeEndpoints(sls)
	if len(eps) == 0 {
		return s
	}
	c := *s
	c.eps = eps
	return &c
}

func clusterIPs(svc *corev1.Service) []netip.Addr {
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP}
	}
	var out []netip.Addr
	for _, s := range ips {
		if a, err := netip.ParseAddr(s); err == nil {
			out = append(out, a.Unmap())
		}
	}
	return out
}

// mergeEndpoints merges the endpoints of a Service's slices, in the order
// of the slices' names; one slice's are shared as they are.
func mergeEndpoints(sls []*sliceInfo) []endpoint {
	if len(sls) == 1 {
		return sls[0].eps
	}
	sls = slices.Clone(sls)
	slices.SortFunc(sls, func(a, b *sliceInfo) int { return strings.Compare(a.name, b.name) })
	var all []endpoint
	for _, sl := range sls {
		all = append(all, sl.eps...)
	}
	return oneByAddress(all)
}

// readyEndpoints are a slice's ready endpoints, one per address.
func readyEndpoints(sl *discoveryv1.EndpointSlice) []endpoint {
	if sl.AddressType != discoveryv1.AddressTypeIPv4 && sl.AddressType != discoveryv1.AddressTypeIPv6 {
		return nil
	}
	ports := slicePorts(sl)
	var eps []endpoint
	for _, e := range sl.Endpoints {
		if e.Conditions.Ready != nil && !*e.Conditions.Ready {
			continue
		}
		for _, s := range e.Addresses {
			a, err := netip.ParseAddr(s)
			if err != nil {
				continue
			}
			a = a.Unmap()
			host := dashedIP(a)
			if e.Hostname != nil && *e.Hostname != "" {
				host = strings.ToLower(*e.Hostname)
			}
			eps = append(eps, endpoint{host: host, addr: a, ports: ports})
		}
	}
	return oneByAddress(eps)
}

// oneByAddress merges endpoints of one address, in order: the same address
// twice (two managers, or a slice being split) is one endpoint whose ports
// are the union, named by the first hostname given, sorted by address.
func oneByAddress(in []endpoint) []endpoint {
	byAddr := map[netip.Addr]int{}
	var eps []endpoint
	for _, e := range in {
		i, ok := byAddr[e.addr]
		if !ok {
			byAddr[e.addr] = len(eps)
			eps = append(eps, e)
			continue
		}
		eps[i].ports = mergePorts(eps[i].ports, e.ports)
		if dashed := dashedIP(e.addr); eps[i].host == dashed && e.host != dashed {
			eps[i].host = e.host
		}
	}
	slices.SortFunc(eps, func(a, b endpoint) int { return a.addr.Compare(b.addr) })
	return eps
}

func slicePorts(sl *discoveryv1.EndpointSlice) []port {
	var out []port
	for _, p := range sl.Ports {
		if p.Port == nil {
			continue // "all ports": nothing an SRV record can name
		}
		np := port{port: *p.Port, proto: "tcp"}
		if p.Name != nil {
			np.name = strings.ToLower(*p.Name)
		}
		if p.Protocol != nil {
			np.proto = strings.ToLower(string(*p.Protocol))
		}
		out = append(out, np)
	}
	return out
}

func mergePorts(a, b []port) []port {
	out := slices.Clone(a)
	for _, p := range b {
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// dashedIP is the name of an endpoint without a hostname, as CoreDNS names
// it: 10-0-0-1, or the compressed IPv6 text with '-' for ':' (a trailing '-'
// gets a '0' so the label does not end in a hyphen).
func dashedIP(a netip.Addr) string {
	if a.Is4() {
		return strings.ReplaceAll(a.String(), ".", "-")
	}
	s := strings.ReplaceAll(a.String(), ":", "-")
	if strings.HasSuffix(s, "-") {
		s += "0"
	}
	return s
}

// parseDashedIP reads the address in a pod record label (a-b-c-d, or IPv6
// with '-' for ':').
func parseDashedIP(label string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(strings.ReplaceAll(label, "-", ".")); err == nil && a.Is4() {
		return a, true
	}
	a, err := netip.ParseAddr(strings.ReplaceAll(label, "-", ":"))
	if err != nil || !a.Is6() || a.Zone() != "" {
		return netip.Addr{}, false
	}
	return a, true
}

// ptrTargets lists what a Service contributes to reverse lookups: each
// ClusterIP names the Service, each endpoint address names the endpoint.
// Names are relative to the zone, like "web-0.db.prod.svc".
func (s *service) ptrTargets() map[netip.Addr][]string {
	out := map[netip.Addr][]string{}
	base := s.key.name + "." + s.key.ns + ".svc"
	for _, ip := range s.ips {
		out[ip] = append(out[ip], base)
	}
	for _, e := range s.eps {
		t := e.host + "." + base
		if !slices.Contains(out[e.addr], t) {
			out[e.addr] = append(out[e.addr], t)
		}
	}
	return out
}

// equal reports whether two record sets answer every query alike, so that a
// Service update DNS cannot see changes neither the index nor the serial.
func (s *service) equal(o *service) bool {
	if s == nil || o == nil {
		return s == o
	}
	return s.key == o.key && s.kind == o.kind && s.external == o.external &&
		slices.Equal(s.ips, o.ips) && slices.Equal(s.ports, o.ports) &&
		slices.EqualFunc(s.eps, o.eps, func(a, b endpoint) bool {
			return a.host == b.host && a.addr == b.addr && slices.Equal(a.ports, b.ports)
		})
}
