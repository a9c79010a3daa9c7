package dns

import (
	"bytes"
	"net"
	"net/netip"
	"testing"

	"github.com/miekg/dns"
)

// captureWriter is a dns.ResponseWriter that packs what the handler writes,
// as the real socket writer does.
type captureWriter struct {
	remote net.Addr
	out    []byte
	err    error
}

func (w *captureWriter) LocalAddr() net.Addr {
	return &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 53}
}
func (w *captureWriter) RemoteAddr() net.Addr { return w.remote }
func (w *captureWriter) WriteMsg(m *dns.Msg) error {
	w.out, w.err = m.Pack()
	return w.err
}
func (w *captureWriter) Write(b []byte) (int, error) { w.out = b; return len(b), nil }
func (w *captureWriter) sentBytes() []byte           { return w.out }
func (w *captureWriter) Close() error                { return nil }
func (w *captureWriter) TsigStatus() error           { return nil }
func (w *captureWriter) TsigTimersOnly(bool)         {}
func (w *captureWriter) Hijack()                     {}

// seedQueries are packed requests worth starting from: every answer case,
// and the odd ones (EDNS versions, transfers, other classes, several
// questions, no question).
func seedQueries() [][]byte {
	var msgs []*dns.Msg
	for _, c := range answerCases {
		msgs = append(msgs, query(c.qname, c.qtype))
	}
	e := query("svc1.testns.svc.cluster.local.", dns.TypeA)
	e.SetEdns0(1232, true)
	msgs = append(msgs, e)
	v1 := query("svc1.testns.svc.cluster.local.", dns.TypeA)
	v1.SetEdns0(4096, false)
	v1.IsEdns0().SetVersion(1)
	ch := query("version.bind.", dns.TypeTXT)
	ch.Question[0].Qclass = dns.ClassCHAOS
	two := query("svc1.testns.svc.cluster.local.", dns.TypeA)
	two.Question = append(two.Question, two.Question[0])
	none := query("x.", dns.TypeA)
	none.Question = nil
	msgs = append(msgs, v1, ch, two, none,
		query("cluster.local.", dns.TypeAXFR),
		query("1.100.96.10.in-addr.arpa.", dns.TypePTR),
		query("svc1.other.testns.svc.cluster.local.", dns.TypeA),
		query("hdls1.testns.svc.cluster.local.", dns.TypeANY))
	var out [][]byte
	for _, m := range msgs {
		b, err := m.Pack()
		if err != nil {
			panic(err)
		}
		out = append(out, b)
	}
	// A compression pointer to itself, and a header cut short.
	out = append(out, []byte{0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 12, 0, 1, 0, 1}, []byte{0, 1, 1})
	return out
}

// FuzzRequestPath feeds arbitrary bytes through what the server does with a
// datagram: unpack, answer (from the fixture, with autopath for a known
// pod, and forwarding with no upstream), fit to the client and pack. It
// must never panic, and every reply must pack and fit a UDP client.
func FuzzRequestPath(f *testing.F) {
	for _, s := range seedQueries() {
		f.Add(s)
	}
	m, err := newMetrics(nil, "dns://fuzz", "cluster.local.")
	if err != nil {
		f.Fatal(err)
	}
	h := NewHandler(testZone(podsVerified), NewForwarder(nil, 0, nil, m), m, true, []string{"corp.example"})
	h.SetIndex(buildIndex(f, fixture()))
	pod := &net.UDPAddr{IP: net.ParseIP(clientPodIP), Port: 40000}
	f.Fuzz(func(t *testing.T, data []byte) {
		req := new(dns.Msg)
		if err := req.Unpack(data); err != nil {
			return // the server drops what does not unpack
		}
		for _, remote := range []net.Addr{pod, &net.TCPAddr{IP: net.ParseIP("fd00::1"), Port: 1}} {
			w := &captureWriter{remote: remote}
			h.ServeDNS(w, req)
			if w.err != nil {
				t.Fatalf("reply to %v does not pack: %v", req, w.err)
			}
			if _, udp := remote.(*net.UDPAddr); udp && len(w.out) > maxUDPSize {
				t.Fatalf("UDP reply of %d bytes to %v", len(w.out), req)
			}
			var reply dns.Msg
			if err := reply.Unpack(w.out); err != nil || reply.Id != req.Id || !reply.Response {
				t.Fatalf("reply %v (%v) to %v", &reply, err, req)
			}
		}
	})
}

// FuzzPackedRepliesMatchTheFullPath answers one datagram by the full path,
// keeping its reply, then asks another of the packed replies: whenever
// the second is answered there, its reply must be, byte for byte, what the
// full path answers it. Seeds pair each query with itself under another
// ID, with RD and CD flipped, and with the next seed.
func FuzzPackedRepliesMatchTheFullPath(f *testing.F) {
	seeds := seedQueries()
	for i, s := range seeds {
		f.Add(s, seeds[(i+1)%len(seeds)], false)
		for _, flip := range [][2]int{{0, 0xff}, {2, 0x01}, {3, 0x10}} {
			v := append([]byte(nil), s...)
			if flip[0] < len(v) {
				v[flip[0]] ^= byte(flip[1])
			}
			f.Add(s, v, true)
		}
	}
	m, err := newMetrics(nil, "dns://fuzz", "cluster.local.")
	if err != nil {
		f.Fatal(err)
	}
	h := NewHandler(testZone(podsVerified), NewForwarder(nil, 0, nil, m), m, true, []string{"corp.example"})
	h.SetIndex(buildIndex(f, fixture()))
	pod, outside := netip.MustParseAddr(clientPodIP), netip.MustParseAddr("192.0.2.99")
	f.Fuzz(func(t *testing.T, first, second []byte, samePod bool) {
		if len(first) < 12 || len(second) < 12 {
			return // the loop drops them
		}
		h.wire.gen.Store(nil)
		asker := outside
		if samePod {
			asker = pod
		}
		servedOnce(h, first, pod)
		got, ok := packedOf(h, second, asker)
		if !ok {
			return
		}
		if want := fullReply(h, second, asker); !bytes.Equal(got, want) {
			t.Fatalf("packed reply to %v after %v:\n got %v\nwant %v", unpacked(second), unpacked(first), unpacked(got), unpacked(want))
		}
	})
}
