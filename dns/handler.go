package dns

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
)

// maxUDPSize caps the EDNS0 payload we answer with, whatever a client
// advertises: 4096 is the most any deployed resolver uses, and CoreDNS
// mirrors the client's size up to it as well.
const maxUDPSize = 4096

// Handler serves DNS queries: the cluster zone from the current Index,
// reverse names the cluster knows, everything else through the Forwarder.
type Handler struct {
	zone    *Zone
	index   atomic.Pointer[Index]
	fwd     *Forwarder
	metrics *metrics
	// search is the tail of a pod's search path after <ns>.svc.<zone>, each
	// a lowercase FQDN, ending with "" (the name as typed); nil disables
	// autopath.
	search []string
	// wire is the packed-answer cache of the UDP path (wire.go), and
	// originWire the zone's origin as its keys spell it.
	wire       wireCache
	originWire []byte
}

// NewHandler serves z, starting from an empty, unsynced index. extraSearch
// are the search domains pods inherit from the node (the resolv.conf the
// server itself uses), tried by autopath after the cluster's own.
func NewHandler(z *Zone, fwd *Forwarder, m *metrics, autopath bool, extraSearch []string) *Handler {
	h := &Handler{zone: z, fwd: fwd, metrics: m, originWire: wireName(z.Origin)}
	h.index.Store(NewIndex())
	if autopath {
		h.search = []string{"svc." + z.Origin, z.Origin}
		for _, s := range extraSearch {
			s = dns.Fqdn(strings.ToLower(s))
			if !z.InZone(s) {
				h.search = append(h.search, s)
			}
		}
		h.search = append(h.search, "")
	}
	return h
}

// SetIndex swaps in the index queries are answered from.
func (h *Handler) SetIndex(ix *Index) { h.index.Store(ix) }

// Index is the index queries are answered from now.
func (h *Handler) Index() *Index { return h.index.Load() }

// ServeDNS implements dns.Handler.
func (h *Handler) ServeDNS(w dns.ResponseWriter, r *dns.Msg) { h.serve(w, r, nil) }

// serve answers r on w, noting in t (when not nil) what decides whether
// the reply may be kept.
func (h *Handler) serve(w dns.ResponseWriter, r *dns.Msg, t *trace) {
	start := time.Now()
	client, tcp := remote(w.RemoteAddr())
	// No deadline here: only forwarding waits, and the forwarder bounds
	// that by --upstream-timeout.
	m, zone := h.resolve(context.Background(), r, client, t)
	if t != nil && t.blocked {
		return // it would have waited: not answered here
	}
	writeReply(w, r, m, tcp)
	var qtype uint16
	if len(r.Question) > 0 {
		qtype = r.Question[0].Qtype
	}
	h.metrics.query(zone, tcp, client.Is6() && !client.Is4In6(), qtype, m.Rcode, time.Since(start))
	if t != nil {
		t.zone, t.rcode = zone, m.Rcode
		if t.autopath {
			h.metrics.autopathHit()
		}
		if t.inline { // the forwarder counted nothing
			h.countHits(t.hits)
		}
	}
}

func remote(a net.Addr) (netip.Addr, bool) {
	switch a := a.(type) {
	case *net.UDPAddr:
		ip, _ := netip.AddrFromSlice(a.IP)
		return ip.Unmap(), false
	case *net.TCPAddr:
		ip, _ := netip.AddrFromSlice(a.IP)
		return ip.Unmap(), true
	}
	return netip.Addr{}, false
}

// writeReply fits the reply to what the client can take (512 bytes over
// UDP without EDNS0, the advertised size with it, 64 KiB over TCP),
// dropping records and setting TC when it does not fit, and mirrors the
// client's EDNS0 record.
func writeReply(w dns.ResponseWriter, r, m *dns.Msg, tcp bool) {
	size := dns.MinMsgSize
	if opt := r.IsEdns0(); opt != nil {
		size = min(max(int(opt.UDPSize()), dns.MinMsgSize), maxUDPSize)
		m.SetEdns0(uint16(size), opt.Do())
	}
	if tcp {
		size = dns.MaxMsgSize
	}
	m.Truncate(size)
	_ = w.WriteMsg(m) // a client that went away needs no answer
}

// Resolve answers r from client, and says which zone label its metrics get.
func (h *Handler) Resolve(ctx context.Context, r *dns.Msg, client netip.Addr) (*dns.Msg, int) {
	return h.resolve(ctx, r, client, nil)
}

func (h *Handler) resolve(ctx context.Context, r *dns.Msg, client netip.Addr, t *trace) (*dns.Msg, int) {
	m := new(dns.Msg)
	m.SetReply(r)
	m.RecursionAvailable = true
	if opt := r.IsEdns0(); opt != nil && opt.Version() != 0 {
		m.Rcode = dns.RcodeBadVers
		return m, zoneOther
	}
	if len(r.Question) != 1 {
		m.Rcode = dns.RcodeFormatError
		return m, zoneOther
	}
	q := r.Question[0]
	do := r.IsEdns0() != nil && r.IsEdns0().Do()
	zone := zoneOther
	if h.zone.InZone(q.Name) {
		zone = zoneCluster
	}
	switch {
	case q.Qclass != dns.ClassINET, q.Qtype == dns.TypeAXFR, q.Qtype == dns.TypeIXFR:
		// Zone transfers would hand out the whole cluster's names; other
		// classes have no records here.
		m.Rcode = dns.RcodeRefused
		return m, zone
	case zone == zoneCluster:
		res, ok := h.autopath(ctx, q, client, do, t)
		if !ok {
			res = h.zone.Answer(h.index.Load(), q)
			h.chase(ctx, &res, q, do, t)
		}
		fill(m, res)
		m.Authoritative = true
		return m, zone
	case q.Qtype == dns.TypePTR:
		if res, ok := h.zone.Reverse(h.index.Load(), q); ok {
			fill(m, res)
			m.Authoritative = true
			return m, zone
		}
	}
	res, err := h.forward(ctx, q, do, t)
	if err != nil {
		m.Rcode = dns.RcodeServerFailure
		return m, zone
	}
	fill(m, res)
	return m, zone
}

func fill(m *dns.Msg, r Result) {
	m.Rcode, m.Answer, m.Ns, m.Extra = r.Rcode, r.Answer, r.Ns, r.Extra
}

// forward asks upstream and gives the owner names the client's spelling
// back (the cached answer may carry another client's case).
func (h *Handler) forward(ctx context.Context, q dns.Question, do bool, t *trace) (Result, error) {
	var up *dns.Msg
	var state freshness
	var err error
	if t != nil && t.inline {
		// The socket's own goroutine may not wait: a fresh cached answer
		// or nothing.
		if up, state = h.fwd.peek(q, do); state != fresh {
			t.blocked = true
			return Result{}, errWouldWait
		}
	} else {
		up, state, err = h.fwd.forward(ctx, q, do)
	}
	t.forwarded(up, state, err)
	if err != nil {
		return Result{}, err
	}
	for _, rr := range up.Answer {
		if hdr := rr.Header(); strings.EqualFold(hdr.Name, q.Name) {
			hdr.Name = q.Name
		}
	}
	extra := up.Extra[:0]
	for _, rr := range up.Extra {
		if rr.Header().Rrtype != dns.TypeOPT {
			extra = append(extra, rr)
		}
	}
	return Result{Rcode: up.Rcode, Answer: up.Answer, Ns: up.Ns, Extra: extra}, nil
}

// chase resolves an ExternalName target outside the zone upstream and
// appends its records after the CNAME. When upstream fails the CNAME alone
// is the answer: the client can still follow it.
func (h *Handler) chase(ctx context.Context, res *Result, q dns.Question, do bool, t *trace) {
	if res.Chase == "" {
		return
	}
	up, err := h.forward(ctx, dns.Question{Name: res.Chase, Qtype: q.Qtype, Qclass: q.Qclass}, do, t)
	res.Chase = ""
	if err != nil {
		return
	}
	res.Answer = append(res.Answer, up.Answer...)
	res.Ns, res.Extra = nil, nil
	if up.Rcode == dns.RcodeNameError {
		res.Rcode = up.Rcode
	}
}

// autopath walks a pod's search path on the server: a query for
// <name>.<pod ns>.svc.<zone> that does not exist is retried as
// <name>.svc.<zone>, <name>.<zone>, <name> under the node's search domains,
// and <name> itself; the first that exists is answered with a CNAME from
// the asked name, saving the pod's resolver a round trip per step. It
// reports false when the query is not one to walk.
func (h *Handler) autopath(ctx context.Context, q dns.Question, client netip.Addr, do bool, t *trace) (Result, bool) {
	if h.search == nil || !client.IsValid() {
		return Result{}, false
	}
	ix := h.index.Load()
	ns, ok := ix.podNamespace(client)
	if !ix.synced || !ok {
		return Result{}, false
	}
	first := ns + ".svc." + h.zone.Origin
	n := len(q.Name) - len(first)
	if n < 2 || q.Name[n-1] != '.' || !strings.EqualFold(q.Name[n:], first) {
		return Result{}, false
	}
	base := q.Name[:n-1]
	firstRes := h.zone.Answer(ix, q)
	if firstRes.Rcode != dns.RcodeNameError {
		h.chase(ctx, &firstRes, q, do, t)
		return firstRes, true
	}
	for _, s := range h.search {
		cq := dns.Question{Name: base + "." + s, Qtype: q.Qtype, Qclass: q.Qclass}
		var res Result
		if h.zone.InZone(cq.Name) {
			res = h.zone.Answer(ix, cq)
			h.chase(ctx, &res, cq, do, t)
		} else if up, err := h.forward(ctx, cq, do, t); err == nil {
			res = up
		} else {
			continue
		}
		if res.Rcode != dns.RcodeSuccess {
			continue
		}
		cname := &dns.CNAME{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeCNAME, Class: dns.ClassINET, Ttl: h.zone.TTL}, Target: cq.Name}
		res.Answer = append([]dns.RR{cname}, res.Answer...)
		if t != nil {
			t.autopath = true // counted once the reply is sent
		} else {
			h.metrics.autopathHit()
		}
		return res, true
	}
	return firstRes, true
}
