package main

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// fakeDNS answers every A query with 127.0.0.1 and every other with no
// records, but drops the first query it gets, closing dropped then.
func fakeDNS(t *testing.T, dropped chan<- struct{}) string {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 512)
		for n := 0; ; n++ {
			size, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if n == 0 {
				close(dropped)
				continue
			}
			q := new(dns.Msg)
			if q.Unpack(buf[:size]) != nil || len(q.Question) != 1 {
				continue
			}
			m := new(dns.Msg)
			m.SetReply(q)
			if q.Question[0].Qtype == dns.TypeA {
				m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5},
					A: net.IPv4(127, 0, 0, 1)}}
			}
			out, _ := m.Pack()
			pc.WriteTo(out, from)
		}
	}()
	return pc.LocalAddr().String()
}

// A request whose lookup lost a query fails; one sent after it, while that
// lookup still waits for its answer, is answered.
func TestGetOnceLooksUpOnItsOwn(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	target := "http://web.lab.test.:" + u.Port() + "/"
	dropped := make(chan struct{})
	server := fakeDNS(t, dropped)
	var d net.Dialer
	dnsDial := func(ctx context.Context, network, _ string) (net.Conn, error) {
		return d.DialContext(ctx, "udp", server)
	}
	first := make(chan error, 1)
	go func() { first <- getOnce(target, time.Second, dnsDial) }()
	<-dropped
	if err := getOnce(target, time.Second, dnsDial); err != nil {
		t.Errorf("the request after a lost query: %v", err)
	}
	if err := <-first; err == nil {
		t.Error("the request whose query was lost was answered")
	}
}
