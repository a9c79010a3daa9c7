package dns

import (
	"bytes"
	"encoding/binary"
	"hash/maphash"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
)

// The packed-answer cache: most queries repeat one of a few thousand
// questions, and their replies are a function of the question, a few
// header bits and the current index. A reply computed once is kept as the
// bytes sent, and the next identical query gets those bytes with its own
// ID, without unpacking the query or building and packing a message.
// With the batched loop (udp.go, batch.go) it took the UDP path from
// 100,000 to 320,000 queries per CPU-second in BenchmarkServingPath
// (dns/README.md, "Performance").
//
// A key is everything of a query the reply depends on: the RD and CD bits,
// EDNS0 (present, version, DO, the payload size as clamped), the question
// as sent (the reply echoes its case), and, where autopath may answer, the
// client pod's namespace. Only queries of the plainest shape have a key
// (one question, no records but an OPT without options); the others take
// the full path. The cache belongs to one index and one set of forwarding
// routes: a swap of either starts an empty one, so an answer is never
// older than the state it was computed from. A forwarded answer is kept
// only when it came fresh from the forwarding cache, and for one second at
// most, the granularity of that cache's TTL countdown.
//
// To hold three times the entries in the same memory, the cache keeps a
// key's 128-bit hash (seeded at random per process: two keys colliding
// is a 1 in 2^128 chance, not one a client can aim for) and a reply
// without its question section, which is the query's own.

// wireCacheSize bounds the packed answers kept: about 150 bytes of heap
// each, 5 MB full.
const wireCacheSize = 32768

// wireShards spreads the cache's locks across the sockets' loops.
const wireShards = 16

// forwardedWireLife is how long a forwarded answer's bytes are reused.
const forwardedWireLife = time.Second

// packedAnswer is a reply as sent, its question section cut out, with
// what the metrics count for it.
type packedAnswer struct {
	wire     []byte
	expires  int64 // Unix nanoseconds on the forwarding cache's clock; 0: while the generation lasts
	rcode    uint16
	zone     uint8
	autopath bool
	hits     [2]uint8 // forwarding cache hits, positive and negative
}

// wireKey is a key's hash.
type wireKey [2]uint64

var wireSeeds = [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}

func hashKey(key []byte) wireKey {
	return wireKey{maphash.Bytes(wireSeeds[0], key), maphash.Bytes(wireSeeds[1], key)}
}

// wireGen is the cache of one index and one routes value.
type wireGen struct {
	ix     *Index
	rt     *routes
	n      atomic.Int64
	shards [wireShards]struct {
		mu sync.RWMutex
		m  map[wireKey]packedAnswer
	}
}

func newWireGen(ix *Index, rt *routes) *wireGen {
	g := &wireGen{ix: ix, rt: rt}
	for i := range g.shards {
		g.shards[i].m = map[wireKey]packedAnswer{}
	}
	return g
}

// wireCache holds the current generation.
type wireCache struct {
	gen atomic.Pointer[wireGen]
}

func (c *wireCache) get(k wireKey, ix *Index, rt *routes) (packedAnswer, bool) {
	g := c.gen.Load()
	if g == nil || g.ix != ix || g.rt != rt {
		return packedAnswer{}, false
	}
	sh := &g.shards[k[0]%wireShards]
	sh.mu.RLock()
	a, ok := sh.m[k]
	sh.mu.RUnlock()
	return a, ok
}

// put keeps a for k in the generation of ix and rt, starting that
// generation if the current one is older.
func (c *wireCache) put(k wireKey, a packedAnswer, ix *Index, rt *routes) {
	g := c.gen.Load()
	if g == nil || g.ix != ix || g.rt != rt {
		fresh := newWireGen(ix, rt)
		if !c.gen.CompareAndSwap(g, fresh) {
			return // another reply started it: this one is not needed
		}
		g = fresh
	}
	sh := &g.shards[k[0]%wireShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if _, ok := sh.m[k]; ok {
		sh.m[k] = a // a forwarded answer renewed
		return
	}
	if g.n.Load() >= wireCacheSize {
		// Map order is random: the first key seen is a random victim.
		for victim := range sh.m {
			delete(sh.m, victim)
			g.n.Add(-1)
			break
		}
	}
	sh.m[k] = a
	g.n.Add(1)
}

// queryShape is what appendKey read of a query.
type queryShape struct {
	qtype  uint16
	inZone bool // the name is in the cluster zone (autopath may apply)
	qend   int  // where the question section ends
}

// appendKey appends to key what a reply to pkt depends on, apart from the
// client's namespace; ok is false for any query that is not one plain
// question, which the full path answers. originWire is the zone's origin
// in wire format, lowercase.
func appendKey(key, pkt, originWire []byte) ([]byte, queryShape, bool) {
	var s queryShape
	if len(pkt) < 12 || pkt[2]&0xf8 != 0 || // QR set, or an opcode other than QUERY
		binary.BigEndian.Uint16(pkt[4:]) != 1 || binary.BigEndian.Uint16(pkt[6:]) != 0 ||
		binary.BigEndian.Uint16(pkt[8:]) != 0 || binary.BigEndian.Uint16(pkt[10:]) > 1 {
		return key, s, false
	}
	// The name: uncompressed labels, at most 255 octets.
	off, nameEnd := 12, -1
	for off < len(pkt) && off-12 < 255 {
		l := int(pkt[off])
		if l == 0 {
			nameEnd = off + 1
			break
		}
		if l > 63 {
			return key, s, false
		}
		off += 1 + l
	}
	if nameEnd < 0 || nameEnd-12 > 255 || nameEnd+4 > len(pkt) {
		return key, s, false
	}
	q := pkt[12 : nameEnd+4]
	s.qend = nameEnd + 4
	s.qtype = binary.BigEndian.Uint16(pkt[nameEnd:])
	s.inZone = nameInZone(pkt[12:nameEnd], originWire)
	edns, rest := [4]byte{}, pkt[nameEnd+4:]
	if binary.BigEndian.Uint16(pkt[10:]) == 1 {
		// One OPT at the root without options; anything else takes the
		// full path, which parses options and reports their errors.
		if len(rest) != 11 || rest[0] != 0 || binary.BigEndian.Uint16(rest[1:]) != 41 || binary.BigEndian.Uint16(rest[9:]) != 0 {
			return key, s, false
		}
		size := min(max(int(binary.BigEndian.Uint16(rest[3:])), 512), maxUDPSize)
		edns = [4]byte{1 | rest[7]>>7<<1, rest[6], byte(size >> 8), byte(size)} // present|DO, version, size
	} else if len(rest) != 0 {
		return key, s, false
	}
	key = append(key, pkt[2]&0x01, pkt[3]&0x10) // RD, CD: the reply copies them
	key = append(key, edns[:]...)
	return append(key, q...), s, true
}

// nameInZone reports whether the wire-format name ends with the origin's
// labels, compared without case.
func nameInZone(name, originWire []byte) bool {
	for off := 0; off < len(name); off += 1 + int(name[off]) {
		if len(name)-off == len(originWire) {
			for i, c := range name[off:] {
				if lower(c) != originWire[i] {
					return false
				}
			}
			return true
		}
	}
	return false
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// wireName is a lowercase FQDN in wire format.
func wireName(fqdn string) []byte {
	var b []byte
	for fqdn != "" && fqdn != "." {
		i := 0
		for i < len(fqdn) && fqdn[i] != '.' {
			i++
		}
		b = append(b, byte(i))
		for _, c := range []byte(fqdn[:i]) {
			b = append(b, lower(c))
		}
		fqdn = fqdn[min(i+1, len(fqdn)):]
	}
	return append(b, 0)
}

// withNamespace adds the client's namespace to a key where autopath may
// answer: the same question from pods of two namespaces has two answers.
func (h *Handler) withNamespace(key []byte, s queryShape, client netip.Addr, ix *Index) []byte {
	if h.search == nil || !s.inZone || !client.IsValid() {
		return key
	}
	if ns, ok := ix.podNamespace(client); ok {
		key = append(append(key, 0), ns...)
	}
	return key
}

// trace is what the full path learns of a reply that decides whether its
// bytes may be kept. Its methods do nothing on a nil trace.
type trace struct {
	ix          *Index
	rt          *routes
	forwards    int      // questions forwarded
	freshHits   int      // of which answered fresh from the forwarding cache, with a TTL of 2 s or more
	hits        [2]uint8 // those hits, positive and negative, for the metrics
	autopath    bool
	zone, rcode int
	// inline is set for the socket's own goroutine, which may not wait for
	// the upstream servers; blocked, when the answer would have.
	inline, blocked bool
}

func (t *trace) forwarded(m *dns.Msg, state freshness, err error) {
	if t == nil {
		return
	}
	t.forwards++
	if err != nil || state != fresh || minTTL(m) < 2 {
		return
	}
	t.freshHits++
	if isNegative(m) {
		t.hits[1]++
	} else {
		t.hits[0]++
	}
}

// minTTL is the smallest TTL of a message's records (OPT aside).
func minTTL(m *dns.Msg) uint32 {
	ttl := ^uint32(0)
	for _, sec := range [][]dns.RR{m.Answer, m.Ns, m.Extra} {
		for _, rr := range sec {
			if h := rr.Header(); h.Rrtype != dns.TypeOPT {
				ttl = min(ttl, h.Ttl)
			}
		}
	}
	return ttl
}

func (h *Handler) routes() *routes {
	if h.fwd == nil {
		return nil
	}
	return h.fwd.routes.Load()
}

// packedReply answers pkt from the packed-answer cache: the reply, with
// pkt's ID, appended to out. key is the caller's buffer, reused from query
// to query. ok is false when the query must take the full path.
func (h *Handler) packedReply(pkt []byte, client netip.Addr, key *[]byte, out []byte) (reply []byte, a packedAnswer, qtype uint16, ok bool) {
	ix, rt := h.index.Load(), h.routes()
	k, s, ok := appendKey((*key)[:0], pkt, h.originWire)
	if !ok {
		return nil, a, 0, false
	}
	k = h.withNamespace(k, s, client, ix)
	*key = k
	if a, ok = h.wire.get(hashKey(k), ix, rt); !ok || a.expires != 0 && h.fwd.cache.now().UnixNano() >= a.expires {
		return nil, a, 0, false
	}
	reply = append(append(append(out, pkt[:2]...), a.wire[2:12]...), pkt[12:s.qend]...)
	return append(reply, a.wire[12:]...), a, s.qtype, true
}

// countPacked counts a reply from the packed-answer cache as the full
// path would have counted it.
func (h *Handler) countPacked(a packedAnswer, qtype uint16, client netip.Addr, start time.Time) {
	h.countHits(a.hits)
	if a.autopath {
		h.metrics.autopathHit()
	}
	h.metrics.query(int(a.zone), false, client.Is6(), qtype, int(a.rcode), time.Since(start))
}

// sentWriter is a UDP ResponseWriter that keeps the bytes it sent.
type sentWriter interface {
	dns.ResponseWriter
	sentBytes() []byte
}

// countHits counts forwarding cache hits, positive and negative.
func (h *Handler) countHits(hits [2]uint8) {
	for range hits[0] {
		h.metrics.cacheHit(false)
	}
	for range hits[1] {
		h.metrics.cacheHit(true)
	}
}

// serveUDP answers req (unpacked from pkt) on w by the full path, and
// keeps the bytes sent when they depend only on the key and on the index
// and routes the answer was computed from. inline says the caller may not
// wait for the upstream servers: it reports false, having sent nothing,
// when the answer needs them.
func (h *Handler) serveUDP(w sentWriter, req *dns.Msg, pkt []byte, client netip.Addr, inline bool) bool {
	t := &trace{ix: h.index.Load(), rt: h.routes(), inline: inline}
	h.serve(w, req, t)
	if t.blocked {
		return false
	}
	sent := w.sentBytes()
	if sent == nil || t.forwards != t.freshHits || h.index.Load() != t.ix || h.routes() != t.rt {
		return true
	}
	k, s, ok := appendKey(nil, pkt, h.originWire)
	// The reply echoes the question: kept without it, it is the query's.
	if !ok || len(sent) < s.qend || binary.BigEndian.Uint16(sent[4:]) != 1 || !bytes.Equal(sent[12:s.qend], pkt[12:s.qend]) {
		return true
	}
	a := packedAnswer{wire: append(append([]byte(nil), sent[:12]...), sent[s.qend:]...), rcode: uint16(t.rcode), zone: uint8(t.zone), autopath: t.autopath, hits: t.hits}
	if t.forwards > 0 {
		a.expires = h.fwd.cache.now().Add(forwardedWireLife).UnixNano()
	}
	h.wire.put(hashKey(h.withNamespace(k, s, client, t.ix)), a, t.ix, t.rt)
	return true
}
