package dns

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netplane/netplane/e2e/netns"
)

// otherPodIP is a pod of the namespace "other".
const otherPodIP = "10.244.2.9"

// wireFixture is the fixture with a pod in a second namespace and a
// headless Service whose A answer (60 addresses) does not fit 512 bytes.
func wireFixture() fixtureObjects {
	o := fixture()
	o.pods = append(o.pods, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "other", Name: "client"},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: otherPodIP}}}})
	o.services = append(o.services, headlessService("testns", "big", httpPort()))
	var eps []ep
	for i := range 60 {
		eps = append(eps, ep{fmt.Sprintf("172.17.0.%d", i+1), "", true})
	}
	o.slices = append(o.slices, slice("testns", "big-a", "big", discoveryv1.AddressTypeIPv4, httpSlicePorts(), eps...))
	return o
}

func wireHandler(t *testing.T, upstream string) *Handler {
	t.Helper()
	h, _ := testHandler(t, upstream, true)
	h.SetIndex(buildIndex(t, wireFixture()))
	return h
}

// packQuery is a query with id and the header bits and EDNS0 edit sets.
func packQuery(t *testing.T, name string, qtype uint16, id uint16, edit func(*dns.Msg)) []byte {
	t.Helper()
	m := query(name, qtype)
	m.Id = id
	if edit != nil {
		edit(m)
	}
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func udpFrom(client netip.Addr) net.Addr {
	return net.UDPAddrFromAddrPort(netip.AddrPortFrom(client, 40000))
}

// fullReply is the full path's reply to pkt, keeping nothing.
func fullReply(h *Handler, pkt []byte, client netip.Addr) []byte {
	w := &captureWriter{remote: udpFrom(client)}
	if req := accept(pkt, w); req != nil {
		h.serve(w, req, nil)
	}
	return w.out
}

// servedOnce answers pkt by the full path as the UDP loop does, keeping
// the reply when it may be kept.
func servedOnce(h *Handler, pkt []byte, client netip.Addr) {
	w := &captureWriter{remote: udpFrom(client)}
	if req := accept(pkt, w); req != nil {
		h.serveUDP(w, req, pkt, client, false)
	}
}

func packedOf(h *Handler, pkt []byte, client netip.Addr) ([]byte, bool) {
	var key []byte
	reply, _, _, ok := h.packedReply(pkt, client, &key, nil)
	return reply, ok
}

func TestPackedRepliesAreTheFullPathsReplies(t *testing.T) {
	up := startUpstream(t, map[string]func(dns.Question) *dns.Msg{"example.com. A": answerA(60, "192.0.2.1")})
	h := wireHandler(t, up.Addr)
	pod, other, outside := netip.MustParseAddr(clientPodIP), netip.MustParseAddr(otherPodIP), netip.MustParseAddr("192.0.2.99")
	edns := func(size uint16, do bool) func(*dns.Msg) { return func(m *dns.Msg) { m.SetEdns0(size, do) } }
	for _, tc := range []struct {
		name          string
		first, second []byte
		from, asker   netip.Addr
		hit           bool // the second must come from the packed replies
	}{
		{"same question, another ID", packQuery(t, "svc1.testns.svc.cluster.local.", dns.TypeA, 1, nil),
			packQuery(t, "svc1.testns.svc.cluster.local.", dns.TypeA, 2, nil), outside, outside, true},
		{"NXDOMAIN", packQuery(t, "nope.testns.svc.cluster.local.", dns.TypeAAAA, 1, nil),
			packQuery(t, "nope.testns.svc.cluster.local.", dns.TypeAAAA, 2, nil), outside, outside, true},
		{"the name's case is echoed", packQuery(t, "svc1.testns.svc.cluster.local.", dns.TypeA, 1, nil),
			packQuery(t, "SVC1.testns.svc.Cluster.Local.", dns.TypeA, 2, nil), outside, outside, false},
		{"RD is copied", packQuery(t, "svc1.testns.svc.cluster.local.", dns.TypeA, 1, nil),
			packQuery(t, "svc1.testns.svc.cluster.local.", dns.TypeA, 2, func(m *dns.Msg) { m.RecursionDesired = false }), outside, outside, false},
		{"CD is copied", packQuery(t, "svc1.testns.svc.cluster.local.", dns.TypeA, 1, nil),
			packQuery(t, "svc1.testns.svc.cluster.local.", dns.TypeA, 2, func(m *dns.Msg) { m.CheckingDisabled = true }), outside, outside, false},
		{"EDNS0 is mirrored", packQuery(t, "svc1.testns.svc.cluster.local.", dns.TypeA, 1, nil),
			packQuery(t, "svc1.testns.svc.cluster.local.", dns.TypeA, 2, edns(1232, false)), outside, outside, false},
		{"DO is mirrored", packQuery(t, "svc1.testns.svc.cluster.local.", dns.TypeA, 1, edns(1232, false)),
			packQuery(t, "svc1.testns.svc.cluster.local.", dns.TypeA, 2, edns(1232, true)), outside, outside, false},
		{"the payload size decides truncation", packQuery(t, "big.testns.svc.cluster.local.", dns.TypeA, 1, edns(512, false)),
			packQuery(t, "big.testns.svc.cluster.local.", dns.TypeA, 2, edns(4096, false)), outside, outside, false},
		{"an EDNS version we do not speak", packQuery(t, "svc1.testns.svc.cluster.local.", dns.TypeA, 1, edns(1232, false)),
			packQuery(t, "svc1.testns.svc.cluster.local.", dns.TypeA, 2, func(m *dns.Msg) { m.SetEdns0(1232, false); m.IsEdns0().SetVersion(1) }), outside, outside, false},
		{"autopath answers per namespace", packQuery(t, "svc1.other.testns.svc.cluster.local.", dns.TypeA, 1, nil),
			packQuery(t, "svc1.other.testns.svc.cluster.local.", dns.TypeA, 2, nil), pod, other, false},
		{"autopath for a pod, then from outside", packQuery(t, "svc1.other.testns.svc.cluster.local.", dns.TypeA, 1, nil),
			packQuery(t, "svc1.other.testns.svc.cluster.local.", dns.TypeA, 2, nil), pod, outside, false},
		{"autopath, same namespace", packQuery(t, "svc1.other.testns.svc.cluster.local.", dns.TypeA, 1, nil),
			packQuery(t, "svc1.other.testns.svc.cluster.local.", dns.TypeA, 2, nil), pod, pod, true},
		{"a reverse name", packQuery(t, "1.100.96.10.in-addr.arpa.", dns.TypePTR, 1, nil),
			packQuery(t, "1.100.96.10.in-addr.arpa.", dns.TypePTR, 2, nil), outside, outside, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h.SetIndex(buildIndex(t, wireFixture())) // start from no packed replies
			servedOnce(h, tc.first, tc.from)
			got, hit := packedOf(h, tc.second, tc.asker)
			if tc.hit && !hit {
				t.Fatal("not answered from the packed replies")
			}
			if !hit {
				return
			}
			if want := fullReply(h, tc.second, tc.asker); !bytes.Equal(got, want) {
				t.Errorf("packed reply differs from the full path's:\n got %v\nwant %v", unpacked(got), unpacked(want))
			}
		})
	}
}

func unpacked(b []byte) *dns.Msg {
	m := new(dns.Msg)
	_ = m.Unpack(b)
	return m
}

func TestPackedRepliesEndWithTheirIndex(t *testing.T) {
	h := wireHandler(t, "")
	q := packQuery(t, "late.testns.svc.cluster.local.", dns.TypeA, 1, nil)
	servedOnce(h, q, netip.Addr{})
	if got, ok := packedOf(h, q, netip.Addr{}); !ok || unpacked(got).Rcode != dns.RcodeNameError {
		t.Fatalf("before the Service: %v (packed %v), want NXDOMAIN from the packed replies", unpacked(got), ok)
	}
	c := h.Index().Edit()
	svc := clusterIPService("testns", "late", []string{"10.96.100.77"}, httpPort())
	c.SetService(svcKey{"testns", "late"}, buildService(svc, nil))
	h.SetIndex(c.Done(2))
	if got, ok := packedOf(h, q, netip.Addr{}); ok {
		t.Fatalf("after the Service appeared the packed reply %v is still served", unpacked(got))
	}
	servedOnce(h, q, netip.Addr{})
	if got, ok := packedOf(h, q, netip.Addr{}); !ok || len(unpacked(got).Answer) != 1 {
		t.Errorf("after the Service: %v (packed %v), want its address", unpacked(got), ok)
	}
}

func TestPackedForwardedRepliesLiveOneSecond(t *testing.T) {
	up := startUpstream(t, map[string]func(dns.Question) *dns.Msg{"example.com. A": answerA(60, "192.0.2.1")})
	h := wireHandler(t, up.Addr)
	now := time.Now()
	h.fwd.cache.now = func() time.Time { return now }
	q := packQuery(t, "example.com.", dns.TypeA, 1, nil)
	ttl := func() uint32 {
		t.Helper()
		got, ok := packedOf(h, q, netip.Addr{})
		if !ok {
			t.Fatal("not answered from the packed replies")
		}
		return unpacked(got).Answer[0].Header().Ttl
	}
	servedOnce(h, q, netip.Addr{}) // asks upstream: not kept, the cache has it now
	if _, ok := packedOf(h, q, netip.Addr{}); ok {
		t.Fatal("an answer just fetched upstream is kept")
	}
	servedOnce(h, q, netip.Addr{}) // fresh from the cache: kept
	if got := ttl(); got != 60 {
		t.Fatalf("TTL %d, want 60", got)
	}
	now = now.Add(1500 * time.Millisecond)
	if _, ok := packedOf(h, q, netip.Addr{}); ok {
		t.Fatal("a forwarded reply is served after a second")
	}
	servedOnce(h, q, netip.Addr{})
	if got := ttl(); got != 59 {
		t.Fatalf("TTL %d after 1.5 s, want 59", got)
	}
	now = now.Add(60 * time.Second)
	servedOnce(h, q, netip.Addr{})
	if n := up.times("example.com. A"); n != 2 {
		t.Errorf("upstream asked %d times, want 2: the answer expired", n)
	}
}

// TestRepliesLeaveFromTheAddressAsked serves on a socket bound to every
// address of a namespace's loopback and asks 127.0.0.2: a client's
// connected socket takes only a reply from there, which the kernel would
// not choose by itself (127.0.0.1 is the route's source).
func TestRepliesLeaveFromTheAddressAsked(t *testing.T) {
	ns := netns.New(t, "dnswild")
	h := wireHandler(t, "")
	var l *Listeners
	if err := ns.Do(func() (err error) { l, err = Listen(":0", 2); return err }); err != nil {
		t.Fatal(err)
	}
	l.Serve(h)
	t.Cleanup(func() { l.Shutdown(context.Background()) })
	_, port, _ := net.SplitHostPort(l.Addr)
	for _, server := range []string{"127.0.0.2", "127.0.0.1", "::1"} {
		for i := range 3 { // the full path, then the packed replies
			var m *dns.Msg
			err := ns.Do(func() (err error) {
				c := &dns.Client{Timeout: 2 * time.Second}
				m, _, err = c.Exchange(query("svc1.testns.svc.cluster.local.", dns.TypeA), net.JoinHostPort(server, port))
				return err
			})
			if err != nil || len(m.Answer) != 1 {
				t.Fatalf("query %d to %s: %v, %v", i+1, server, m, err)
			}
		}
	}
}

func TestTheSocketsGoroutineNeverWaitsForUpstream(t *testing.T) {
	up := startUpstream(t, map[string]func(dns.Question) *dns.Msg{"example.com. A": answerA(60, "192.0.2.1")})
	h := wireHandler(t, up.Addr)
	inline := func(name string) (bool, []byte) {
		w := &captureWriter{remote: udpFrom(netip.Addr{})}
		pkt := packQuery(t, name, dns.TypeA, 7, nil)
		req := accept(pkt, w)
		return h.serveUDP(w, req, pkt, netip.Addr{}, true), w.out
	}
	requests := func() float64 { return counterValue(h.metrics.requests[zoneOther][0][0][typeIndex(dns.TypeA)]) }
	if ok, out := inline("svc1.testns.svc.cluster.local."); !ok || len(unpacked(out).Answer) != 1 {
		t.Fatalf("a cluster name: answered %v, %v", ok, unpacked(out))
	}
	if ok, out := inline("example.com."); ok || out != nil || requests() != 0 || up.times("example.com. A") != 0 {
		t.Fatalf("a name to ask upstream: answered %v with %v, %v requests counted, upstream asked %d times; want nothing done",
			ok, out, requests(), up.times("example.com. A"))
	}
	servedOnce(h, packQuery(t, "example.com.", dns.TypeA, 8, nil), netip.Addr{}) // as a worker does
	if ok, out := inline("example.com."); !ok || len(unpacked(out).Answer) != 1 {
		t.Fatalf("a name in the cache: answered %v, %v", ok, unpacked(out))
	}
	if got := counterValue(h.metrics.cacheHits[0]); got != 1 {
		t.Errorf("cache hits %v, want 1", got)
	}
}
