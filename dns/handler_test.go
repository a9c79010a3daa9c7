package dns

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// fakeUpstream is a DNS server on loopback that answers from a table and
// counts what it is asked.
type fakeUpstream struct {
	Addr    string
	mu      sync.Mutex
	asked   map[string]int // "name TYPE" → times, names lowercase
	answers map[string]func(q dns.Question) *dns.Msg
	tcp     atomic.Int64
}

// startUpstream serves answers: for each "name TYPE" key a function that
// builds the answer, "* TYPE" for any other name; anything else is
// NXDOMAIN with an SOA of minimum 60.
func startUpstream(t testing.TB, answers map[string]func(q dns.Question) *dns.Msg) *fakeUpstream {
	t.Helper()
	u := &fakeUpstream{asked: map[string]int{}, answers: answers}
	pc, l := listenBoth(t)
	u.Addr = pc.LocalAddr().String()
	h := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		q := r.Question[0]
		key := strings.ToLower(q.Name) + " " + dns.TypeToString[q.Qtype]
		u.mu.Lock()
		u.asked[key]++
		f := u.answers[key]
		if f == nil {
			f = u.answers["* "+dns.TypeToString[q.Qtype]]
		}
		u.mu.Unlock()
		_, tcp := w.RemoteAddr().(*net.TCPAddr)
		if tcp {
			u.tcp.Add(1)
		}
		var m *dns.Msg
		if f != nil {
			m = f(q)
			if m == nil {
				return // never answer: a dead upstream
			}
		} else {
			m = new(dns.Msg)
			m.Rcode = dns.RcodeNameError
			m.Ns = rrs(t, "net. 300 IN SOA a.net. b.net. 1 2 3 4 60")
		}
		m.SetRcode(r, m.Rcode)
		if opt := r.IsEdns0(); !tcp && opt != nil {
			m.Truncate(int(opt.UDPSize()))
		} else if !tcp {
			m.Truncate(dns.MinMsgSize)
		}
		_ = w.WriteMsg(m)
	})
	servers := []*dns.Server{{PacketConn: pc, Handler: h}, {Listener: l, Handler: h}}
	for _, s := range servers {
		go func() { _ = s.ActivateAndServe() }()
	}
	t.Cleanup(func() {
		for _, s := range servers {
			_ = s.Shutdown()
		}
	})
	return u
}

// listenBoth opens UDP and TCP on one free loopback port; a port free for
// UDP may be taken for TCP, so it tries a few.
func listenBoth(t testing.TB) (net.PacketConn, net.Listener) {
	t.Helper()
	for range 10 {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		l, err := net.Listen("tcp", pc.LocalAddr().String())
		if err == nil {
			return pc, l
		}
		pc.Close()
	}
	t.Fatal("no loopback port free for both UDP and TCP")
	return nil, nil
}

func (u *fakeUpstream) times(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.asked[key]
}

func answerA(ttl uint32, ip string) func(q dns.Question) *dns.Msg {
	return func(q dns.Question) *dns.Msg {
		m := new(dns.Msg)
		m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: ttl}, A: net.ParseIP(ip)}}
		return m
	}
}

// testHandler serves the fixture, with upstream as the forwarder's server.
func testHandler(t testing.TB, upstream string, autopath bool) (*Handler, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := newMetrics(reg, "dns://test", "cluster.local.")
	if err != nil {
		t.Fatal(err)
	}
	fwd := NewForwarder([]string{upstream}, 300*time.Millisecond, NewCache(100, 30*time.Second, 0), m)
	h := NewHandler(testZone(podsInsecure), fwd, m, autopath, []string{"corp.example"})
	h.SetIndex(buildIndex(t, fixture()))
	return h, reg
}

func query(name string, qtype uint16) *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	return m
}

func TestForwardedAnswersAreCachedForTheirTTL(t *testing.T) {
	up := startUpstream(t, map[string]func(dns.Question) *dns.Msg{"example.com. A": answerA(60, "192.0.2.1")})
	h, reg := testHandler(t, up.Addr, false)
	for i := range 3 {
		m, _ := h.Resolve(context.Background(), query("Example.COM.", dns.TypeA), netip.Addr{})
		if m.Rcode != dns.RcodeSuccess || len(m.Answer) != 1 || m.Answer[0].Header().Name != "Example.COM." {
			t.Fatalf("query %d: %v", i, m)
		}
		if m.Authoritative {
			t.Error("a forwarded answer is marked authoritative")
		}
	}
	if n := up.times("example.com. A"); n != 1 {
		t.Errorf("upstream asked %d times, want 1 (the rest from cache)", n)
	}
	if got := counterValue(h.metrics.cacheHits[0]); got != 2 {
		t.Errorf("cache hits %v, want 2", got)
	}
	if !gathered(t, reg, "coredns_cache_hits_total") {
		t.Error("cache hits are not registered")
	}
}

func TestNegativeAnswersAreCachedAndExpire(t *testing.T) {
	up := startUpstream(t, nil)
	h, _ := testHandler(t, up.Addr, false)
	now := time.Now()
	h.fwd.cache.now = func() time.Time { return now }
	for range 2 {
		m, _ := h.Resolve(context.Background(), query("nope.example.net.", dns.TypeA), netip.Addr{})
		if m.Rcode != dns.RcodeNameError {
			t.Fatalf("rcode %s, want NXDOMAIN", dns.RcodeToString[m.Rcode])
		}
	}
	if n := up.times("nope.example.net. A"); n != 1 {
		t.Fatalf("upstream asked %d times, want 1", n)
	}
	now = now.Add(31 * time.Second) // past --cache-max-ttl (30s), inside the SOA minimum (60s)
	h.Resolve(context.Background(), query("nope.example.net.", dns.TypeA), netip.Addr{})
	if n := up.times("nope.example.net. A"); n != 2 {
		t.Errorf("upstream asked %d times after the cap expired, want 2", n)
	}
}

func TestCacheCountsTTLDownAndStaysBounded(t *testing.T) {
	c := NewCache(cacheShards, time.Hour, 0) // one entry per shard
	via := &servers{}
	now := time.Now()
	c.now = func() time.Time { return now }
	m := new(dns.Msg)
	m.Answer = rrs(t, "a.example. 100 IN A 192.0.2.1")
	k := keyOf(dns.Question{Name: "A.example.", Qtype: dns.TypeA, Qclass: dns.ClassINET}, false)
	c.Put(k, m, via)
	now = now.Add(40 * time.Second)
	if got, _ := c.Get(k, via); got == nil || got.Answer[0].Header().Ttl != 60 {
		t.Fatalf("after 40s got %v, want TTL 60", got)
	}
	now = now.Add(61 * time.Second)
	if got, _ := c.Get(k, via); got != nil {
		t.Errorf("expired entry returned: %v", got)
	}
	for i := range 1000 {
		c.Put(keyOf(dns.Question{Name: strings.Repeat("x", i%50+1) + ".example.", Qtype: uint16(i)}, false), m, via)
	}
	if n := c.Len(); n > cacheShards {
		t.Errorf("cache holds %d entries, bound is %d", n, cacheShards)
	}
}

// The upstreams of --resolv-conf are its nameservers given by address, at
// port 53 (a name would need DNS to be reached), and its search domains
// are the node's, which autopath walks.
func TestResolvConfGivesAddressedNameserversAndSearchDomains(t *testing.T) {
	cases := []struct {
		name, conf      string
		servers, search string
	}{
		{"a kubelet's node file", "# comment\nnameserver 10.0.0.10\nnameserver fd00::53\nnameserver dns.example\n" +
			"search corp.example lab.example\noptions ndots:5 timeout:2\n", "[10.0.0.10:53 [fd00::53]:53]", "[corp.example lab.example]"},
		{"domain sets one search domain", "nameserver 192.0.2.1\ndomain corp.example\n", "[192.0.2.1:53]", "[corp.example]"},
		{"the last search line wins", "search a.example\nsearch b.example\n", "[]", "[b.example]"},
		{"empty", "", "[]", "[]"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "resolv.conf")
			if err := os.WriteFile(path, []byte(c.conf), 0o644); err != nil {
				t.Fatal(err)
			}
			servers, search, err := ResolvConf(path)
			if err != nil {
				t.Fatal(err)
			}
			if got := fmt.Sprint(servers); got != c.servers {
				t.Errorf("servers %s, want %s", got, c.servers)
			}
			if got := fmt.Sprint(search); got != c.search {
				t.Errorf("search %s, want %s", got, c.search)
			}
		})
	}
	if _, _, err := ResolvConf(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("a missing resolv.conf is no error")
	}
}

func TestDeadUpstreamIsServfailWithinTheTimeout(t *testing.T) {
	up := startUpstream(t, map[string]func(dns.Question) *dns.Msg{"slow.example. A": func(dns.Question) *dns.Msg { return nil }})
	h, _ := testHandler(t, up.Addr, false)
	start := time.Now()
	m, _ := h.Resolve(context.Background(), query("slow.example.", dns.TypeA), netip.Addr{})
	if took := time.Since(start); took > time.Second {
		t.Errorf("took %v with a 300ms upstream timeout", took)
	}
	if m.Rcode != dns.RcodeServerFailure {
		t.Errorf("rcode %s, want SERVFAIL", dns.RcodeToString[m.Rcode])
	}
}

func TestTruncatedUpstreamAnswerIsRetriedOverTCP(t *testing.T) {
	big := func(q dns.Question) *dns.Msg {
		m := new(dns.Msg)
		for i := range 120 {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.IPv4(192, 0, 2, byte(i))})
		}
		return m
	}
	up := startUpstream(t, map[string]func(dns.Question) *dns.Msg{"big.example. A": big})
	h, _ := testHandler(t, up.Addr, false)
	m, _ := h.Resolve(context.Background(), query("big.example.", dns.TypeA), netip.Addr{})
	if len(m.Answer) != 120 || up.tcp.Load() == 0 {
		t.Errorf("%d answers, %d TCP queries upstream; want all 120 fetched over TCP", len(m.Answer), up.tcp.Load())
	}
}

func TestExternalNameIsChasedUpstreamAfterTheCNAME(t *testing.T) {
	up := startUpstream(t, map[string]func(dns.Question) *dns.Msg{"example.net. A": answerA(60, "192.0.2.7")})
	h, _ := testHandler(t, up.Addr, false)
	m, _ := h.Resolve(context.Background(), query("external.testns.svc.cluster.local.", dns.TypeA), netip.Addr{})
	checkSection(t, "answer", m.Answer, rrs(t,
		"external.testns.svc.cluster.local. 5 IN CNAME example.net.",
		"example.net. 60 IN A 192.0.2.7"))
	if m.Answer[0].Header().Rrtype != dns.TypeCNAME {
		t.Error("the CNAME is not first")
	}
}

func TestRequestsOutsideTheProtocolAreRefused(t *testing.T) {
	h, _ := testHandler(t, "127.0.0.1:1", false)
	badvers := query("svc1.testns.svc.cluster.local.", dns.TypeA)
	badvers.SetEdns0(1232, false)
	badvers.IsEdns0().SetVersion(1)
	chaos := query("version.bind.", dns.TypeTXT)
	chaos.Question[0].Qclass = dns.ClassCHAOS
	for _, c := range []struct {
		name  string
		req   *dns.Msg
		rcode int
	}{
		{"EDNS version 1 is BADVERS", badvers, dns.RcodeBadVers},
		{"AXFR is refused", query("cluster.local.", dns.TypeAXFR), dns.RcodeRefused},
		{"IXFR is refused", query("cluster.local.", dns.TypeIXFR), dns.RcodeRefused},
		{"class CHAOS is refused", chaos, dns.RcodeRefused},
	} {
		m, _ := h.Resolve(context.Background(), c.req, netip.Addr{})
		if m.Rcode != c.rcode {
			t.Errorf("%s: rcode %s, want %s", c.name, dns.RcodeToString[m.Rcode], dns.RcodeToString[c.rcode])
		}
	}
}

// The autopath chains are those CoreDNS's autopath plugin answers (and
// coredns/ci's kubernetes tests expect): the name the search path completes
// is answered with a CNAME from the name asked to the name found, then the
// record. The client pod is in testns, whose resolver appends
// "testns.svc.cluster.local." first.
func TestAutopathAnswersTheSearchPathWithACNAME(t *testing.T) {
	up := startUpstream(t, map[string]func(dns.Question) *dns.Msg{
		"foo.example.net. A":             answerA(60, "192.0.2.9"),
		"intranet.corp.example. A":       answerA(60, "192.0.2.10"),
		"broken.example.testns.svc. A":   nil,
		"svc1.testns.svc.cluster.local.": nil,
	})
	h, reg := testHandler(t, up.Addr, true)
	client := netip.MustParseAddr(clientPodIP)
	cases := []struct {
		name, qname string
		rcode       int
		answer      []string
	}{
		{"typed svc1: first candidate exists, no CNAME", "svc1.testns.svc.cluster.local.", dns.RcodeSuccess,
			[]string{"svc1.testns.svc.cluster.local. 5 IN A 10.96.100.1"}},
		{"typed svc1.other", "svc1.other.testns.svc.cluster.local.", dns.RcodeSuccess, []string{
			"svc1.other.testns.svc.cluster.local. 5 IN CNAME svc1.other.svc.cluster.local.",
			"svc1.other.svc.cluster.local. 5 IN A 10.96.100.9"}},
		{"typed svc1.testns.svc", "svc1.testns.svc.testns.svc.cluster.local.", dns.RcodeSuccess, []string{
			"svc1.testns.svc.testns.svc.cluster.local. 5 IN CNAME svc1.testns.svc.cluster.local.",
			"svc1.testns.svc.cluster.local. 5 IN A 10.96.100.1"}},
		{"typed the full name without a dot", "svc1.testns.svc.cluster.local.testns.svc.cluster.local.", dns.RcodeSuccess, []string{
			"svc1.testns.svc.cluster.local.testns.svc.cluster.local. 5 IN CNAME svc1.testns.svc.cluster.local.",
			"svc1.testns.svc.cluster.local. 5 IN A 10.96.100.1"}},
		{"external name goes upstream", "foo.example.net.testns.svc.cluster.local.", dns.RcodeSuccess, []string{
			"foo.example.net.testns.svc.cluster.local. 5 IN CNAME foo.example.net.",
			"foo.example.net. 60 IN A 192.0.2.9"}},
		{"node search domain", "intranet.testns.svc.cluster.local.", dns.RcodeSuccess, []string{
			"intranet.testns.svc.cluster.local. 5 IN CNAME intranet.corp.example.",
			"intranet.corp.example. 60 IN A 192.0.2.10"}},
		{"nothing exists: the first NXDOMAIN", "nothing.testns.svc.cluster.local.", dns.RcodeNameError, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, _ := h.Resolve(context.Background(), query(c.qname, dns.TypeA), client)
			if m.Rcode != c.rcode {
				t.Errorf("rcode %s, want %s", dns.RcodeToString[m.Rcode], dns.RcodeToString[c.rcode])
			}
			checkSection(t, "answer", m.Answer, rrs(t, c.answer...))
			if len(m.Answer) > 0 && len(c.answer) > 1 && m.Answer[0].Header().Rrtype != dns.TypeCNAME {
				t.Error("the CNAME is not first")
			}
			if m.Question[0].Name != c.qname {
				t.Errorf("question became %s", m.Question[0].Name)
			}
		})
	}
	if got := counterValue(h.metrics.autopath); got != 5 || !gathered(t, reg, "coredns_autopath_success_total") {
		t.Errorf("autopath counted %v times, want 5", got)
	}

	// A client that is not a known pod gets no server-side search.
	m, _ := h.Resolve(context.Background(), query("svc1.other.testns.svc.cluster.local.", dns.TypeA), netip.MustParseAddr("10.1.1.1"))
	if m.Rcode != dns.RcodeNameError {
		t.Errorf("unknown client: rcode %s, want NXDOMAIN", dns.RcodeToString[m.Rcode])
	}
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	_ = c.Write(&m)
	return m.GetCounter().GetValue()
}

func gathered(t testing.TB, reg *prometheus.Registry, name string) bool {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return true
		}
	}
	return false
}
