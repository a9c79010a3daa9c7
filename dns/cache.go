package dns

import (
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// cacheShards spreads the cache's locks so concurrent queries rarely meet.
const cacheShards = 32

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
	stored  time.Time
	expires time.Time
}

// Cache holds upstream answers, positive and negative, each for its TTL
// capped at maxTTL, with at most size entries: when full, an arbitrary
// entry makes room, as CoreDNS's cache does. Answers of the cluster zone
// never come here; they are computed fresh from the index.
type Cache struct {
	maxTTL time.Duration
	perCap int
	shards [cacheShards]struct {
		mu sync.RWMutex
		m  map[cacheKey]cacheEntry
	}
	now func() time.Time
}

// NewCache returns a cache of about size entries; size 0 disables caching.
func NewCache(size int, maxTTL time.Duration) *Cache {
	c := &Cache{maxTTL: maxTTL, perCap: (size + cacheShards - 1) / cacheShards, now: time.Now}
	for i := range c.shards {
		c.shards[i].m = map[cacheKey]cacheEntry{}
	}
	return c
}

func keyOf(q dns.Question, do bool) cacheKey {
	return cacheKey{strings.ToLower(q.Name), q.Qtype, q.Qclass, do}
}

// Get returns a copy of a live cached answer with its TTLs counted down, or
// nil.
func (c *Cache) Get(k cacheKey) *dns.Msg {
	if c == nil || c.perCap == 0 {
		return nil
	}
	sh := &c.shards[shardOf(k)%cacheShards]
	sh.mu.RLock()
	e, ok := sh.m[k]
	sh.mu.RUnlock()
	now := c.now()
	if !ok || !now.Before(e.expires) {
		return nil
	}
	m := e.msg.Copy()
	age := uint32(now.Sub(e.stored) / time.Second)
	for _, sec := range [][]dns.RR{m.Answer, m.Ns, m.Extra} {
		for _, rr := range sec {
			if h := rr.Header(); h.Ttl > age {
				h.Ttl -= age
			} else {
				h.Ttl = 0
			}
		}
	}
	return m
}

// Put stores an upstream answer for as long as it says it may be cached:
// the smallest TTL of a positive answer, the SOA's negative TTL of a
// negative one, capped at maxTTL. Failures and answers without a lifetime
// are not stored.
func (c *Cache) Put(k cacheKey, m *dns.Msg) {
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
		for old := range sh.m {
			delete(sh.m, old)
			break
		}
	}
	sh.m[k] = cacheEntry{msg: m.Copy(), stored: now, expires: now.Add(d)}
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
