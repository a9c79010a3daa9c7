package dns

import (
	"iter"
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
// Its ports are its slice's, one list the slice's endpoints point to: a
// slice header in each was 16 bytes more an endpoint, 1 MB of the 62,500
// endpoints of docs/benchmarks.md's relist.
type endpoint struct {
	host  string // the slice's hostname, lowercase; none for most endpoints
	addr  netip.Addr
	ports *[]port
}

// portList is the endpoint's ports.
func (e endpoint) portList() []port {
	if e.ports == nil {
		return nil
	}
	return *e.ports
}

// name is the endpoint's label: its hostname, else its dashed address,
// made when asked rather than kept (a string an endpoint).
func (e endpoint) name() string {
	if e.host != "" {
		return e.host
	}
	return dashedIP(e.addr)
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
	eps      endpoints // ready only, one per address
}

// endpoints are a Service's ready endpoints: the lists of its slices, each
// sorted by address and shared with the slice's record, in the order of the
// slices' names. When an address is in two slices (two managers, a slice
// being split) they are one merged list instead. No list is empty.
type endpoints [][]endpoint

// all yields every endpoint, list by list.
func (es endpoints) all() iter.Seq[endpoint] {
	return func(yield func(endpoint) bool) {
		for _, l := range es {
			for _, e := range l {
				if !yield(e) {
					return
				}
			}
		}
	}
}

// at is the endpoint of address a, if there is one.
func (es endpoints) at(a netip.Addr) (endpoint, bool) {
	for _, l := range es {
		if i, ok := slices.BinarySearchFunc(l, a, func(e endpoint, a netip.Addr) int { return e.addr.Compare(a) }); ok {
			return l[i], true
		}
	}
	return endpoint{}, false
}

func (es endpoints) count() int {
	n := 0
	for _, l := range es {
		n += len(l)
	}
	return n
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

// mergeEndpoints gathers the endpoints of a Service's slices. Each slice's
// list is shared as it is unless an address is in two of them: a merged
// copy of every endpoint of a Service of three 100-endpoint slices was as
// large as the slices' own lists.
func mergeEndpoints(sls []*sliceInfo) endpoints {
	var out endpoints
	if len(sls) > 1 {
		sls = slices.Clone(sls)
		slices.SortFunc(sls, func(a, b *sliceInfo) int { return strings.Compare(a.name, b.name) })
	}
	n := 0
	for _, sl := range sls {
		if len(sl.eps) > 0 {
			out = append(out, sl.eps)
			n += len(sl.eps)
		}
	}
	if len(out) <= 1 || distinctAddresses(out, n) {
		return slices.Clip(out)
	}
	all := make([]endpoint, 0, n)
	for _, l := range out {
		all = append(all, l...)
	}
	return endpoints{oneByAddress(all)}
}

// distinctAddresses reports whether no address is in two of the n
// endpoints of es.
func distinctAddresses(es endpoints, n int) bool {
	addrs := make([]netip.Addr, 0, n)
	for e := range es.all() {
		addrs = append(addrs, e.addr)
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	for i := 1; i < len(addrs); i++ {
		if addrs[i] == addrs[i-1] {
			return false
		}
	}
	return true
}

// readyEndpoints are a slice's ready endpoints, one per address.
func readyEndpoints(sl *discoveryv1.EndpointSlice) []endpoint {
	if sl.AddressType != discoveryv1.AddressTypeIPv4 && sl.AddressType != discoveryv1.AddressTypeIPv6 {
		return nil
	}
	var ports *[]port // shared by the slice's endpoints
	if ps := slicePorts(sl); len(ps) > 0 {
		ports = &ps
	}
	eps := make([]endpoint, 0, len(sl.Endpoints))
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
			var host string
			if e.Hostname != nil {
				host = strings.ToLower(*e.Hostname)
			}
			eps = append(eps, endpoint{host: host, addr: a, ports: ports})
		}
	}
	return oneByAddress(eps)
}

// oneByAddress merges endpoints of one address, in order: the same address
// twice (two managers, or a slice being split) is one endpoint whose ports
// are the union, named by the first hostname given, sorted by address. The
// result is kept: it is allocated at the size it needs.
func oneByAddress(in []endpoint) []endpoint {
	if len(in) == 0 {
		return nil
	}
	byAddr := make(map[netip.Addr]int, len(in))
	eps := make([]endpoint, 0, len(in))
	for _, e := range in {
		i, ok := byAddr[e.addr]
		if !ok {
			byAddr[e.addr] = len(eps)
			eps = append(eps, e)
			continue
		}
		if merged := mergePorts(eps[i].portList(), e.portList()); len(merged) > len(eps[i].portList()) {
			eps[i].ports = &merged
		}
		if eps[i].host == "" {
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

// addrs are the addresses a Service gives names in reverse lookups, its
// ClusterIPs and its endpoints', sorted, each once; none for nil.
func (s *service) addrs() []netip.Addr {
	if s == nil {
		return nil
	}
	out := make([]netip.Addr, 0, len(s.ips)+s.eps.count())
	out = append(out, s.ips...)
	for e := range s.eps.all() {
		out = append(out, e.addr)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// ptrNames are the names a has in s's reverse lookups, relative to the
// zone: a ClusterIP names the Service ("db.prod.svc"), an endpoint's
// address the endpoint ("web-0.db.prod.svc"). They are made per query
// rather than kept, a string an endpoint.
func (s *service) ptrNames(a netip.Addr) []string {
	base := s.key.name + "." + s.key.ns + ".svc"
	var out []string
	if slices.Contains(s.ips, a) {
		out = append(out, base)
	}
	if e, ok := s.eps.at(a); ok {
		out = append(out, e.name()+"."+base)
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
		slices.EqualFunc(s.eps, o.eps, func(a, b []endpoint) bool {
			return slices.EqualFunc(a, b, func(a, b endpoint) bool {
				return a.host == b.host && a.addr == b.addr && slices.Equal(a.portList(), b.portList())
			})
		})
}
