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
// servers: those of the longest stub domain a name is in, else the
// upstream servers. UDP first, TCP when the UDP answer is truncated, the
// next server when one fails, and an error (the caller's SERVFAIL) once
// the timeout is spent, never a hang. Identical concurrent questions share
// one upstream query. With serve-stale, an expired answer stands in while
// every server fails.
type Forwarder struct {
	routes  atomic.Pointer[routes]
	timeout time.Duration
	cache   *Cache
	metrics *metrics
	flight  singleflight.Group
}

// NewForwarder forwards to upstreams (IP or IP:port; port 53 when absent).
func NewForwarder(upstreams []string, timeout time.Duration, cache *Cache, m *metrics) *Forwarder {
	f := &Forwarder{timeout: timeout, cache: cache, metrics: m}
	f.routes.Store(newRoutes(forwarding{upstreams: upstreams}, nil))
	return f
}

// Reroute sends names to fw's servers from now on, and drops the cached
// answers of the names whose servers changed. Queries on their way keep
// the servers they started with.
func (f *Forwarder) Reroute(fw forwarding) *routes {
	r := newRoutes(fw, f.routes.Load())
	f.routes.Store(r)
	f.cache.Drop(r)
	return r
}

// peek is the answer to q in the cache, if one is there, counting nothing.
func (f *Forwarder) peek(q dns.Question, do bool) (*dns.Msg, freshness) {
	k := keyOf(q, do)
	return f.cache.Get(k, f.routes.Load().route(k.name))
}

// errWouldWait says an answer needs the upstream servers, which the caller
// may not wait for.
var errWouldWait = errors.New("the answer needs the upstream servers")

// errNoUpstream says there is nowhere to forward to.
var errNoUpstream = errors.New("no upstream DNS server: set --upstream-servers or list nameservers in --resolv-conf")

// Forward answers q from the cache or upstream. The returned message is the
// caller's to change. do asks for DNSSEC records.
func (f *Forwarder) Forward(ctx context.Context, q dns.Question, do bool) (*dns.Msg, error) {
	m, _, err := f.forward(ctx, q, do)
	return m, err
}

// forward is Forward, saying also whether the answer came fresh from the
// cache (fresh), or from anywhere else (absent).
func (f *Forwarder) forward(ctx context.Context, q dns.Question, do bool) (*dns.Msg, freshness, error) {
	k := keyOf(q, do)
	via := f.routes.Load().route(k.name)
	cached, state := f.cache.Get(k, via)
	switch state {
	case fresh:
		f.metrics.cacheHit(isNegative(cached))
		return cached, fresh, nil
	case staleServe:
		// The servers failed to refresh it already: answering now beats
		// making every client wait the timeout for them to fail again.
		f.refresh(k, q, do, via)
		f.metrics.servedStale()
		return cached, staleServe, nil
	}
	if f.cache != nil && f.cache.perCap > 0 {
		f.metrics.cacheMiss()
	}
	m, err := f.fetch(ctx, k, q, do, via)
	if err != nil && state == staleVerify {
		f.cache.Failing(k, via)
		f.metrics.servedStale()
		return cached, staleServe, nil
	}
	return m, absent, err
}

// fetch asks via's servers and caches the answer; concurrent identical
// questions share one query.
func (f *Forwarder) fetch(ctx context.Context, k cacheKey, q dns.Question, do bool, via *servers) (*dns.Msg, error) {
	v, err, _ := f.flight.Do(fmt.Sprint(k), f.query(ctx, k, q, do, via))
	if err != nil {
		return nil, err
	}
	return v.(*dns.Msg).Copy(), nil
}

// refresh asks again for an answer served stale, on no client's time and
// without waiting: the answer replaces the stale one once a server gives
// it. A refresh already on its way is joined, not repeated.
func (f *Forwarder) refresh(k cacheKey, q dns.Question, do bool, via *servers) {
	f.flight.DoChan(fmt.Sprint(k), f.query(context.Background(), k, q, do, via))
}

func (f *Forwarder) query(ctx context.Context, k cacheKey, q dns.Question, do bool, via *servers) func() (any, error) {
	return func() (any, error) {
		m, err := f.exchange(ctx, via, q, do)
		if err == nil {
			f.cache.Put(k, m, via)
		}
		return m, err
	}
}

// exchange asks the servers in turn, starting with a different one each
// time so the load spreads, within one overall timeout.
func (f *Forwarder) exchange(ctx context.Context, via *servers, q dns.Question, do bool) (*dns.Msg, error) {
	if len(via.addrs) == 0 {
		return nil, errNoUpstream
	}
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	req := new(dns.Msg)
	req.SetQuestion(q.Name, q.Qtype)
	req.Question[0].Qclass = q.Qclass
	req.SetEdns0(1232, do)
	start := int(via.next.Add(1))
	var errs []error
	for i := range via.addrs {
		up := via.addrs[(start+i)%len(via.addrs)]
		deadline, _ := ctx.Deadline()
		// Leave the servers not yet tried their share of the time.
		share := time.Until(deadline) / time.Duration(len(via.addrs)-i)
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
