package dns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sync/singleflight"
)

// Forwarder resolves names outside the cluster zone through upstream
// servers: UDP first, TCP when the UDP answer is truncated, the next server
// when one fails, and an error (the caller's SERVFAIL) once the timeout is
// spent, never a hang. Identical concurrent questions share one upstream
// query.
type Forwarder struct {
	upstreams []string // host:port
	timeout   time.Duration
	cache     *Cache
	metrics   *metrics
	next      atomic.Uint32
	flight    singleflight.Group
}

// NewForwarder forwards to upstreams (IP or IP:port; port 53 when absent).
func NewForwarder(upstreams []string, timeout time.Duration, cache *Cache, m *metrics) *Forwarder {
	f := &Forwarder{timeout: timeout, cache: cache, metrics: m}
	for _, u := range upstreams {
		if _, err := netip.ParseAddr(u); err == nil {
			u = net.JoinHostPort(u, "53")
		}
		f.upstreams = append(f.upstreams, u)
	}
	return f
}

// errNoUpstream says there is nowhere to forward to.
var errNoUpstream = errors.New("no upstream DNS server: set --upstream or list nameservers in --resolv-conf")

// Forward answers q from the cache or upstream. The returned message is the
// caller's to change. do asks for DNSSEC records.
func (f *Forwarder) Forward(ctx context.Context, q dns.Question, do bool) (*dns.Msg, error) {
	k := keyOf(q, do)
	if m := f.cache.Get(k); m != nil {
		f.metrics.cacheHit(isNegative(m))
		return m, nil
	}
	if f.cache != nil && f.cache.perCap > 0 {
		f.metrics.cacheMiss()
	}
	v, err, _ := f.flight.Do(fmt.Sprint(k), func() (any, error) {
		m, err := f.exchange(ctx, q, do)
		if err == nil {
			f.cache.Put(k, m)
		}
		return m, err
	})
	if err != nil {
		return nil, err
	}
	return v.(*dns.Msg).Copy(), nil
}

// exchange asks the upstream servers in turn, starting with a different one
// each time so the load spreads, within one overall timeout.
func (f *Forwarder) exchange(ctx context.Context, q dns.Question, do bool) (*dns.Msg, error) {
	if len(f.upstreams) == 0 {
		return nil, errNoUpstream
	}
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	req := new(dns.Msg)
	req.SetQuestion(q.Name, q.Qtype)
	req.Question[0].Qclass = q.Qclass
	req.SetEdns0(1232, do)
	start := int(f.next.Add(1))
	var errs []error
	for i := range f.upstreams {
		up := f.upstreams[(start+i)%len(f.upstreams)]
		deadline, _ := ctx.Deadline()
		// Leave the servers not yet tried their share of the time.
		share := time.Until(deadline) / time.Duration(len(f.upstreams)-i)
		m, err := f.ask(ctx, up, req, share)
		if err == nil {
			f.metrics.upstreamResponse(up, m.Rcode)
			return m, nil
		}
		f.metrics.upstreamError(up)
		errs = append(errs, fmt.Errorf("%s: %w", up, err))
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("upstream servers failed for %s: %w", q.Name, errors.Join(errs...))
}

func (f *Forwarder) ask(ctx context.Context, up string, req *dns.Msg, timeout time.Duration) (*dns.Msg, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c := &dns.Client{Net: "udp", UDPSize: 1232}
	m, _, err := c.ExchangeContext(ctx, req, up)
	if err == nil && m.Truncated {
		c = &dns.Client{Net: "tcp"}
		m, _, err = c.ExchangeContext(ctx, req, up)
	}
	if err != nil {
		return nil, err
	}
	if m.Rcode == dns.RcodeServerFailure || m.Rcode == dns.RcodeRefused {
		return nil, fmt.Errorf("answered %s", dns.RcodeToString[m.Rcode])
	}
	return m, nil
}

// ResolvConf reads the nameservers (as IP:port, at resolv.conf's port 53)
// and the search domains of a resolv.conf. A nameserver given by name is
// skipped: asking it would need DNS.
func ResolvConf(path string) (servers, search []string, err error) {
	c, err := dns.ClientConfigFromFile(path)
	if err != nil {
		return nil, nil, err
	}
	for _, s := range c.Servers {
		if a, err := netip.ParseAddr(s); err == nil {
			servers = append(servers, net.JoinHostPort(a.String(), c.Port))
		}
	}
	return servers, c.Search, nil
}
