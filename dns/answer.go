package dns

import (
	"net/netip"
	"strings"

	"github.com/miekg/dns"
)

// Pod record modes, as CoreDNS's kubernetes plugin names them.
const (
	podsDisabled = "disabled"
	podsInsecure = "insecure"
	podsVerified = "verified"
)

// Zone is the configuration the answer logic needs: the cluster domain and
// the record rules a cluster operator chooses.
type Zone struct {
	Origin     string // lowercase FQDN, "cluster.local."
	TTL        uint32
	PodRecords string
	// DNSService is the Service whose name and ClusterIPs answer NS at the apex.
	DNSService svcKey
}

// Result is an answer for one question, before it becomes a message.
type Result struct {
	Rcode  int
	Answer []dns.RR
	Ns     []dns.RR
	Extra  []dns.RR
	// Chase, when set, is a CNAME target outside the zone: the caller resolves
	// it upstream and appends what it finds to Answer.
	Chase string
}

// maxChase bounds CNAME chains inside the zone (ExternalName → ExternalName).
const maxChase = 8

// InZone reports whether name (any case, fully qualified) is in the zone.
func (z *Zone) InZone(name string) bool {
	n, o := len(name), len(z.Origin)
	if n < o || !strings.EqualFold(name[n-o:], z.Origin) {
		return false
	}
	return n == o || name[n-o-1] == '.'
}

// Answer answers a question for a name in the zone from ix. It is a pure
// function of its inputs; the server adds the message header, EDNS and
// truncation around it.
func (z *Zone) Answer(ix *Index, q dns.Question) Result {
	if !z.InZone(q.Name) {
		return Result{Rcode: dns.RcodeRefused}
	}
	if !ix.synced {
		// The empty index would say NXDOMAIN, which resolvers cache and
		// applications believe; SERVFAIL makes them retry.
		return Result{Rcode: dns.RcodeServerFailure}
	}
	l := lookup{z: z, ix: ix, q: q}
	r := l.answer()
	for depth := 0; r.Chase != "" && depth < maxChase && z.InZone(r.Chase) && q.Qtype != dns.TypeCNAME; depth++ {
		next := lookup{z: z, ix: ix, q: dns.Question{Name: r.Chase, Qtype: q.Qtype, Qclass: q.Qclass}}
		nr := next.answer()
		r.Answer = append(r.Answer, nr.Answer...)
		r.Rcode, r.Extra, r.Ns, r.Chase = nr.Rcode, nr.Extra, nr.Ns, nr.Chase
	}
	if q.Qtype == dns.TypeCNAME || z.InZone(r.Chase) {
		r.Chase = ""
	}
	return r
}

// lookup is one question being answered.
type lookup struct {
	z  *Zone
	ix *Index
	q  dns.Question
}

// zoneText is the zone as the query spelled it: names the answer makes up
// (SRV targets, the SOA) follow the query's case, as CoreDNS's do.
func (l *lookup) zoneText() string { return l.q.Name[len(l.q.Name)-len(l.z.Origin):] }

// labels are the query's labels left of the zone, lowercase, right to left.
func (l *lookup) labels() []string {
	rel := strings.ToLower(l.q.Name[:len(l.q.Name)-len(l.z.Origin)])
	rel = strings.TrimSuffix(rel, ".")
	if rel == "" {
		return nil
	}
	parts := strings.Split(rel, ".")
	for i, j := 0, len(parts)-1; i < j; i, j = i+1, j-1 {
		parts[i], parts[j] = parts[j], parts[i]
	}
	return parts
}

func (l *lookup) answer() Result {
	ls := l.labels()
	switch {
	case len(ls) == 0:
		return l.apex()
	case len(ls) == 1 && ls[0] == "dns-version":
		if l.q.Qtype == dns.TypeTXT {
			return Result{Answer: []dns.RR{&dns.TXT{Hdr: l.hdr(l.q.Name, dns.TypeTXT, 28800), Txt: []string{"1.1.0"}}}}
		}
		return l.nodata()
	case len(ls) == 1 && (ls[0] == "svc" || ls[0] == "pod"):
		return l.nodata()
	case len(ls) == 2 && (ls[0] == "svc" || ls[0] == "pod"):
		if l.ix.namespaceExists(ls[1]) {
			return l.nodata()
		}
		return l.nxdomain()
	case ls[0] == "svc":
		return l.underService(ls)
	case ls[0] == "pod" && len(ls) == 3:
		return l.pod(ls[1], ls[2])
	}
	return l.nxdomain()
}

// underService answers <svc>.<ns>.svc and the names below it: an endpoint,
// or _port._proto. Anything deeper is NXDOMAIN.
func (l *lookup) underService(ls []string) Result {
	s := l.ix.service(ls[1], ls[2])
	if s == nil {
		return l.nxdomain()
	}
	switch {
	case len(ls) == 3:
		return l.service(s)
	case s.kind == kindExternalName, s.kind == kindHeadless && len(s.eps) == 0:
		return l.nxdomain()
	case len(ls) == 4:
		return l.endpoint(s, ls[3])
	case len(ls) == 5:
		return l.namedPort(s, strings.TrimPrefix(ls[4], "_"), strings.TrimPrefix(ls[3], "_"))
	}
	return l.nxdomain()
}

func (l *lookup) service(s *service) Result {
	switch s.kind {
	case kindExternalName:
		cname := &dns.CNAME{Hdr: l.hdr(l.q.Name, dns.TypeCNAME, l.z.TTL), Target: s.external}
		return Result{Answer: []dns.RR{cname}, Chase: s.external}
	case kindHeadless:
		if len(s.eps) == 0 {
			// The spec (2.4.1) and CoreDNS: a headless Service without
			// ready endpoints does not exist.
			return l.nxdomain()
		}
	}
	switch l.q.Qtype {
	case dns.TypeA, dns.TypeAAAA:
		return l.addresses(l.serviceAddrs(s))
	case dns.TypeSRV:
		return l.srv(s, func(port) bool { return true })
	}
	return l.nodata()
}

func (l *lookup) serviceAddrs(s *service) []netip.Addr {
	if s.kind == kindClusterIP {
		return s.ips
	}
	out := make([]netip.Addr, 0, s.eps.count())
	for e := range s.eps.all() {
		out = append(out, e.addr)
	}
	return out
}

// addresses answers A or AAAA from the addresses of an existing name: those
// of the asked family, else NODATA.
func (l *lookup) addresses(addrs []netip.Addr) Result {
	var rr []dns.RR
	for _, a := range addrs {
		if r := l.addrRR(l.q.Name, a); r != nil {
			rr = append(rr, r)
		}
	}
	if len(rr) == 0 {
		return l.nodata()
	}
	return Result{Answer: rr}
}

// addrRR is an A or AAAA record for a if the question asks a's family.
func (l *lookup) addrRR(name string, a netip.Addr) dns.RR {
	switch {
	case a.Is4() && l.q.Qtype == dns.TypeA:
		return &dns.A{Hdr: l.hdr(name, dns.TypeA, l.z.TTL), A: a.AsSlice()}
	case a.Is6() && l.q.Qtype == dns.TypeAAAA:
		return &dns.AAAA{Hdr: l.hdr(name, dns.TypeAAAA, l.z.TTL), AAAA: a.AsSlice()}
	}
	return nil
}

func (l *lookup) endpoint(s *service, host string) Result {
	// A label in an endpoint's dashed form names an endpoint without a
	// hostname that has that address.
	dashed, isDashed := parseDashedIP(host)
	isDashed = isDashed && dashedIP(dashed) == host
	var addrs []netip.Addr
	for e := range s.eps.all() {
		if e.host == host || isDashed && e.host == "" && e.addr == dashed {
			addrs = append(addrs, e.addr)
		}
	}
	if len(addrs) == 0 {
		return l.nxdomain()
	}
	if l.q.Qtype == dns.TypeA || l.q.Qtype == dns.TypeAAAA {
		return l.addresses(addrs)
	}
	return l.nodata()
}

func (l *lookup) namedPort(s *service, name, proto string) Result {
	match := func(p port) bool { return p.name == name && p.proto == proto }
	found := false
	for _, p := range s.ports {
		found = found || match(p)
	}
	for e := range s.eps.all() {
		for _, p := range e.portList() {
			found = found || match(p)
		}
	}
	if !found {
		return l.nxdomain()
	}
	if l.q.Qtype != dns.TypeSRV {
		return l.nodata()
	}
	return l.srv(s, match)
}

// srv answers SRV: for a ClusterIP Service one record per port pointing at
// the Service, for a headless one a record per ready endpoint and port
// pointing at the endpoint's name, with the targets' addresses as
// additional records. The weight splits 100 evenly, as CoreDNS does.
func (l *lookup) srv(s *service, match func(port) bool) Result {
	type target struct {
		name  string
		port  int32
		addrs []netip.Addr
	}
	base := s.key.name + "." + s.key.ns + ".svc." + l.zoneText()
	var ts []target
	if s.kind == kindClusterIP {
		for _, p := range s.ports {
			if match(p) {
				ts = append(ts, target{base, p.port, s.ips})
			}
		}
	} else {
		for e := range s.eps.all() {
			for _, p := range e.portList() {
				if match(p) {
					ts = append(ts, target{e.name() + "." + base, p.port, []netip.Addr{e.addr}})
				}
			}
		}
	}
	if len(ts) == 0 {
		return l.nodata()
	}
	weight := uint16(100 / len(ts))
	var r Result
	seen := map[target2]bool{}
	extra := map[string]bool{}
	for _, t := range ts {
		if k := (target2{t.name, t.port}); !seen[k] {
			seen[k] = true
			r.Answer = append(r.Answer, &dns.SRV{Hdr: l.hdr(l.q.Name, dns.TypeSRV, l.z.TTL), Weight: weight, Port: uint16(t.port), Target: t.name})
		}
		for _, a := range t.addrs {
			if k := t.name + "/" + a.String(); !extra[k] {
				extra[k] = true
				r.Extra = append(r.Extra, l.glue(t.name, a))
			}
		}
	}
	return r
}

type target2 struct {
	name string
	port int32
}

// glue is the A or AAAA record of a, whatever the question asked.
func (l *lookup) glue(name string, a netip.Addr) dns.RR {
	if a.Is4() {
		return &dns.A{Hdr: l.hdr(name, dns.TypeA, l.z.TTL), A: a.AsSlice()}
	}
	return &dns.AAAA{Hdr: l.hdr(name, dns.TypeAAAA, l.z.TTL), AAAA: a.AsSlice()}
}

// pod answers a-b-c-d.<ns>.pod per --pod-records.
func (l *lookup) pod(ns, label string) Result {
	a, ok := parseDashedIP(label)
	if !ok || l.z.PodRecords == podsDisabled || !l.ix.namespaceExists(ns) {
		return l.nxdomain()
	}
	if l.z.PodRecords == podsVerified && !l.ix.podIn(a, ns) {
		return l.nxdomain()
	}
	return l.addresses([]netip.Addr{a})
}

func (l *lookup) apex() Result {
	switch l.q.Qtype {
	case dns.TypeSOA:
		return Result{Answer: []dns.RR{l.soa()}}
	case dns.TypeNS:
		s := l.ix.service(l.z.DNSService.ns, l.z.DNSService.name)
		if s == nil || s.kind != kindClusterIP || len(s.ips) == 0 {
			return l.nodata()
		}
		name := s.key.name + "." + s.key.ns + ".svc." + l.zoneText()
		r := Result{Answer: []dns.RR{&dns.NS{Hdr: l.hdr(l.q.Name, dns.TypeNS, l.z.TTL), Ns: name}}}
		for _, a := range s.ips {
			r.Extra = append(r.Extra, l.glue(name, a))
		}
		return r
	}
	return l.nodata()
}

func (l *lookup) soa() dns.RR {
	zone := l.zoneText()
	return &dns.SOA{
		Hdr:     l.hdr(zone, dns.TypeSOA, min(l.z.TTL, 300)),
		Ns:      "ns.dns." + zone,
		Mbox:    "hostmaster." + zone,
		Serial:  l.ix.serial,
		Refresh: 7200,
		Retry:   1800,
		Expire:  86400,
		Minttl:  l.z.TTL,
	}
}

// nodata is "the name exists, not with this type": NOERROR, the SOA in
// authority so resolvers cache the absence for the zone's TTL.
func (l *lookup) nodata() Result { return Result{Ns: []dns.RR{l.soa()}} }

func (l *lookup) nxdomain() Result {
	return Result{Rcode: dns.RcodeNameError, Ns: []dns.RR{l.soa()}}
}

func (l *lookup) hdr(name string, t uint16, ttl uint32) dns.RR_Header {
	return dns.RR_Header{Name: name, Rrtype: t, Class: dns.ClassINET, Ttl: ttl}
}

// Reverse answers a PTR question from the Services' ClusterIPs and
// endpoints. ok is false for an address the cluster does not know, which
// the server then forwards, as kubeadm's CoreDNS falls through.
func (z *Zone) Reverse(ix *Index, q dns.Question) (r Result, ok bool) {
	a, ok := reverseAddr(q.Name)
	if !ok || !ix.synced {
		return Result{}, false
	}
	owners := ix.reverse.namers(a)
	if len(owners) == 0 {
		return Result{}, false
	}
	seen := map[string]bool{}
	for _, k := range owners {
		s := ix.service(k.ns, k.name)
		if s == nil {
			continue
		}
		for _, name := range s.ptrNames(a) {
			if seen[name] {
				continue
			}
			seen[name] = true
			hdr := dns.RR_Header{Name: q.Name, Rrtype: dns.TypePTR, Class: dns.ClassINET, Ttl: z.TTL}
			r.Answer = append(r.Answer, &dns.PTR{Hdr: hdr, Ptr: name + "." + z.Origin})
		}
	}
	return r, true
}

// reverseAddr reads the address of d.c.b.a.in-addr.arpa. or the 32-nibble
// ip6.arpa. form; anything else (a partial name, a bad label) is not one.
func reverseAddr(name string) (netip.Addr, bool) {
	lower := strings.ToLower(name)
	if rest, ok := strings.CutSuffix(lower, ".in-addr.arpa."); ok {
		parts := strings.Split(rest, ".")
		if len(parts) != 4 {
			return netip.Addr{}, false
		}
		a, err := netip.ParseAddr(parts[3] + "." + parts[2] + "." + parts[1] + "." + parts[0])
		return a, err == nil
	}
	if rest, ok := strings.CutSuffix(lower, ".ip6.arpa."); ok {
		parts := strings.Split(rest, ".")
		if len(parts) != 32 {
			return netip.Addr{}, false
		}
		var b [16]byte
		for i, p := range parts {
			if len(p) != 1 {
				return netip.Addr{}, false
			}
			n := strings.IndexByte("0123456789abcdef", p[0])
			if n < 0 {
				return netip.Addr{}, false
			}
			nib := 31 - i
			b[nib/2] |= byte(n) << (4 * (1 - nib%2))
		}
		return netip.AddrFrom16(b), true
	}
	return netip.Addr{}, false
}
