package dns

import (
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/internal/informer"
)

// answering is a fake server on loopback answering every A question with
// ip (TTL 60), so an answer tells which server gave it.
func answering(t *testing.T, ip string) *fakeUpstream {
	return startUpstream(t, map[string]func(dns.Question) *dns.Msg{"* A": answerA(60, ip)})
}

// startForwarding runs the DNS role's server for names outside the cluster
// zone: its API server never answers, which leaves forwarding untouched.
// before changes the server before it serves.
func startForwarding(t *testing.T, c v1alpha1.DNS, before func(*Server)) (*Server, *prometheus.Registry) {
	t.Helper()
	dead, err := kubernetes.NewForConfig(&restConfigForNowhere)
	if err != nil {
		t.Fatal(err)
	}
	c.KubeDNSConfigMap = ""
	reg := prometheus.NewRegistry()
	s, err := New(informer.New(dead), dead, c, reg, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	if before != nil {
		before(s)
	}
	l, err := Listen(c.BindAddress, runtime.GOMAXPROCS(0))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.Serve(ctx, l)
	t.Cleanup(func() {
		cancel()
		sctx, scancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer scancel()
		l.Shutdown(sctx)
	})
	return s, reg
}

// answerIP is the one A record's address of an answer, or why there is none.
func answerIP(m *dns.Msg) (string, error) {
	if m.Rcode != dns.RcodeSuccess || len(m.Answer) != 1 {
		return "", fmt.Errorf("rcode %s with %d answers, want NOERROR with one A", dns.RcodeToString[m.Rcode], len(m.Answer))
	}
	a, ok := m.Answer[0].(*dns.A)
	if !ok {
		return "", fmt.Errorf("answer %s is no A record", m.Answer[0])
	}
	return a.A.String(), nil
}

func TestStubDomainsAreAnsweredByTheirOwnServers(t *testing.T) {
	up, corp, lab := answering(t, "192.0.2.1"), answering(t, "10.0.0.1"), answering(t, "10.0.0.2")
	c := dnsConfig(t, up.Addr)
	c.StubDomains = map[string][]string{"corp.example": {corp.Addr}, "Lab.Corp.Example.": {lab.Addr}}
	s, _ := startForwarding(t, c, nil)
	cases := []struct{ name, want string }{
		{"corp.example.", "10.0.0.1"},
		{"www.corp.example.", "10.0.0.1"},
		{"WWW.Lab.Corp.Example.", "10.0.0.2"},
		{"a.b.lab.corp.example.", "10.0.0.2"},
		{"xcorp.example.", "192.0.2.1"},
		{"example.com.", "192.0.2.1"},
	}
	for _, network := range []string{"udp", "tcp"} {
		for _, tc := range cases {
			ip, err := answerIP(ask(t, network, s.Listeners.Addr, query(tc.name, dns.TypeA), netip.Addr{}))
			if err != nil || ip != tc.want {
				t.Errorf("%s %s: %s (%v), want %s", network, tc.name, ip, err, tc.want)
			}
		}
	}
	if n := up.times("www.corp.example. A") + up.times("a.b.lab.corp.example. A") + corp.times("a.b.lab.corp.example. A"); n != 0 {
		t.Errorf("a stub domain's name was asked of another server %d times", n)
	}
}

// clock is a test's time for the cache, moved by hand.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// An upstream answer outlives its TTL while the upstream server is down:
// every query of the outage is answered with it (TTL at most 30 s), until
// the server answers again and the answer is refreshed, or until the
// serve-stale period after its expiry ends (SERVFAIL).
func TestServeStaleAnswersThroughAnOutageThenRefreshes(t *testing.T) {
	var down atomic.Bool
	var addr atomic.Value
	addr.Store("192.0.2.1")
	up := startUpstream(t, map[string]func(dns.Question) *dns.Msg{"app.example. A": func(q dns.Question) *dns.Msg {
		if down.Load() {
			return nil // times out
		}
		return answerA(300, addr.Load().(string))(q) // cached for --cache-max-ttl, 30s
	}})
	c := dnsConfig(t, up.Addr)
	c.ServeStale.Duration = 5 * time.Second
	c.UpstreamTimeout.Duration = 200 * time.Millisecond
	clk := &clock{now: time.Now()}
	s, _ := startForwarding(t, c, func(s *Server) { s.Handler.fwd.cache.now = clk.Now })
	get := func() *dns.Msg {
		return ask(t, "udp", s.Listeners.Addr, query("app.example.", dns.TypeA), netip.Addr{})
	}
	if ip, err := answerIP(get()); ip != "192.0.2.1" {
		t.Fatalf("first answer %s (%v)", ip, err)
	}

	down.Store(true)
	clk.Add(31 * time.Second) // expired a second ago
	const outage = 40
	for i := range outage {
		m := get()
		ip, err := answerIP(m)
		if ip != "192.0.2.1" {
			t.Fatalf("query %d of the outage: %s (%v), want the last address", i, ip, err)
		}
		if ttl := m.Answer[0].Header().Ttl; ttl > 30 {
			t.Errorf("query %d of the outage: TTL %d, want at most 30", i, ttl)
		}
		clk.Add(50 * time.Millisecond) // 2 s of outage in all
	}
	if got := counterValue(s.metrics.cacheStale); got != outage {
		t.Errorf("%v stale answers counted, want %d", got, outage)
	}

	addr.Store("192.0.2.2")
	down.Store(false)
	framework.EventuallyEvery(t, 10*time.Millisecond, 2*time.Second, "the answer to be refreshed", func() error {
		ip, err := answerIP(get())
		if err == nil && ip != "192.0.2.2" {
			err = fmt.Errorf("answered %s", ip)
		}
		return err
	})

	down.Store(true)
	clk.Add(30*time.Second + 5*time.Second + time.Second) // past its life in the cache and the serve-stale period
	if m := get(); m.Rcode != dns.RcodeServerFailure {
		t.Errorf("after the serve-stale period: %s with %v, want SERVFAIL", dns.RcodeToString[m.Rcode], m.Answer)
	}
}
