package dns

import (
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// cacheShards spreads the cache's locks so concurrent queries rarely meet.
const cacheShards = 32

// staleTTL is the TTL of an answer served stale: RFC 8767's 30 s, so a
// client asks again soon after the upstream servers are back.
const staleTTL = 30

// evictSample is how many entries a full shard looks at to choose the one
// to drop: the one that can be served for the shortest time.
const evictSample = 8

// cacheKey identifies an upstream answer: the name (lowercase), type,
// class, and whether the client asked for DNSSEC records.
type cacheKey struct {
	name   string
	qtype  uint16
	qclass uint16
	do     bool
}

type cacheEntry struct {
	msg     *dns.Msg
	via     *servers // who answered: the entry is valid while its name routes there
	stored  time.Time
	expires time.Time
	// failing is set when the servers failed to refresh the entry after it
	// expired: until it is refreshed, it is served stale at once.
	failing bool
}

// Cache holds upstream answers, positive and negative, each for its TTL
// capped at maxTTL, and for stale more after that (serve-stale), with at
// most size entries. Answers of the cluster zone never come here; they
// are computed fresh from the index.
type Cache struct {
	maxTTL time.Duration
	stale  time.Duration
	perCap int
	shards [cacheShards]struct {
		mu sync.RWMutex
		m  map[cacheKey]cacheEntry
	}
	now func() time.Time
}

// NewCache returns a cache of about size entries, each kept for stale after
// it expires; size 0 disables caching.
func NewCache(size int, maxTTL, stale time.Duration) *Cache {
	c := &Cache{maxTTL: maxTTL, stale: stale, perCap: (size + cacheShards - 1) / cacheShards, now: time.Now}
	for i := range c.shards {
		c.shards[i].m = map[cacheKey]cacheEntry{}
	}
	return c
}

func keyOf(q dns.Question, do bool) cacheKey {
	return cacheKey{strings.ToLower(q.Name), q.Qtype, q.Qclass, do}
}

// freshness is what may be done with a cached answer.
type freshness int

const (
	absent      freshness = iota // nothing to serve: ask the servers
	fresh                        // within its TTL: serve it
	staleVerify                  // expired, within serve-stale: ask the servers, serve it if they fail
	staleServe                   // expired, and the servers failed since: serve it now, refresh behind
)

// judge decides what an entry that expires at expires is good for at now,
// with serve-stale window and failing set when the servers failed to
// refresh it since it expired.
func judge(now, expires time.Time, window time.Duration, failing bool) freshness {
	switch {
	case now.Before(expires):
		return fresh
	case window <= 0 || !now.Before(expires.Add(window)):
		return absent
	case failing:
		return staleServe
	}
	return staleVerify
}

// Get returns a copy of the answer to k from via, if one may be served,
// and what it may be served as: a fresh one with its TTLs counted down, a
// stale one with TTL staleTTL.
func (c *Cache) Get(k cacheKey, via *servers) (*dns.Msg, freshness) {
	if c == nil || c.perCap == 0 {
		return nil, absent
	}
	sh := &c.shards[shardOf(k)%cacheShards]
	sh.mu.RLock()
	e, ok := sh.m[k]
	sh.mu.RUnlock()
	if !ok || e.via != via {
		return nil, absent
	}
	now := c.now()
	state := judge(now, e.expires, c.stale, e.failing)
	if state == absent {
		return nil, absent
	}
	m := e.msg.Copy()
	age := uint32(now.Sub(e.stored) / time.Second)
	for _, sec := range [][]dns.RR{m.Answer, m.Ns, m.Extra} {
		for _, rr := range sec {
			switch h := rr.Header(); {
			case h.Rrtype == dns.TypeOPT:
			case state != fresh:
				h.Ttl = staleTTL
			case h.Ttl > age:
				h.Ttl -= age
			default:
				h.Ttl = 0
			}
		}
	}
	return m, state
}

// Put stores an upstream answer from via for as long as it says it may be
// cached: the smallest TTL of a positive answer, the SOA's negative TTL of
// a negative one, capped at maxTTL. Failures and answers without a
// lifetime are not stored.
func (c *Cache) Put(k cacheKey, m *dns.Msg, via *servers) {
	if c == nil || c.perCap == 0 {
		return
	}
	ttl, ok := cacheTTL(m)
	if !ok {
		return
	}
	d := min(time.Duration(ttl)*time.Second, c.maxTTL)
	if d <= 0 {
		return
	}
	now := c.now()
	sh := &c.shards[shardOf(k)%cacheShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if _, exists := sh.m[k]; !exists && len(sh.m) >= c.perCap {
		delete(sh.m, c.victim(sh.m))
	}
	sh.m[k] = cacheEntry{msg: m.Copy(), via: via, stored: now, expires: now.Add(d)}
}

// victim is the entry to drop from a full shard: of a few (the map's
// order is random), the one whose serving ends first, so answers kept for
// serve-stale give way only to answers that could be served longer.
func (c *Cache) victim(m map[cacheKey]cacheEntry) cacheKey {
	var k cacheKey
	var end time.Time
	n := 0
	for key, e := range m {
		if n == 0 || e.expires.Before(end) {
			k, end = key, e.expires
		}
		if n++; n == evictSample {
			break
		}
	}
	return k
}

// Failing marks the answer to k from via as one the servers failed to
// refresh, so it is served stale at once until a refresh succeeds.
func (c *Cache) Failing(k cacheKey, via *servers) {
	if c == nil || c.perCap == 0 {
		return
	}
	sh := &c.shards[shardOf(k)%cacheShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e, ok := sh.m[k]; ok && e.via == via {
		e.failing = true
		sh.m[k] = e
	}
}

// Drop removes every entry whose name no longer routes to the servers
// that answered it, after a change of the routes: they could not be
// served, and would hold the room of answers that can.
func (c *Cache) Drop(r *routes) {
	if c == nil {
		return
	}
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		for k, e := range sh.m {
			if r.route(k.name) != e.via {
				delete(sh.m, k)
			}
		}
		sh.mu.Unlock()
	}
}

// Len is the number of entries, live or expired.
func (c *Cache) Len() int {
	n := 0
	for i := range c.shards {
		c.shards[i].mu.RLock()
		n += len(c.shards[i].m)
		c.shards[i].mu.RUnlock()
	}
	return n
}

// cacheTTL is how long an answer may be cached (RFC 2308 for negative
// answers: the lesser of the SOA's TTL and its minimum).
func cacheTTL(m *dns.Msg) (uint32, bool) {
	negative := m.Rcode == dns.RcodeNameError || m.Rcode == dns.RcodeSuccess && len(m.Answer) == 0
	if m.Truncated || (m.Rcode != dns.RcodeSuccess && m.Rcode != dns.RcodeNameError) {
		return 0, false
	}
	if negative {
		for _, rr := range m.Ns {
			if soa, ok := rr.(*dns.SOA); ok {
				return min(soa.Hdr.Ttl, soa.Minttl), true
			}
		}
		return 0, false
	}
	ttl := ^uint32(0)
	for _, sec := range [][]dns.RR{m.Answer, m.Ns} {
		for _, rr := range sec {
			ttl = min(ttl, rr.Header().Ttl)
		}
	}
	return ttl, true
}

// isNegative says whether a cached answer is a denial (for the hit metric).
func isNegative(m *dns.Msg) bool {
	return m.Rcode == dns.RcodeNameError || len(m.Answer) == 0
}
