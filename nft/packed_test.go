package nft

import (
	"fmt"
	"maps"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/nftables/expr"
)

func v4ID(i int) string {
	return NewID(nil).Addr(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})).String()
}

// sampleAddr is element i of the sample's set "addrs" (program_test.go).
func sampleAddr(i int) string {
	return NewID(nil).Addr(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})).String()
}

func TestPackedElementsAreTheMapTheyCameFrom(t *testing.T) {
	many := map[string]uint32{}
	for i := range 10000 {
		many[v4ID(i)] = 1
	}
	counted := map[string]uint32{}
	for i := range 300 {
		counted[v4ID(i)] = uint32(i%3 + 1)
	}
	long := map[string]uint32{ // a verdict to a chain of 200 bytes: a two-byte length
		NewID(nil).Addr(netip.MustParseAddr("10.9.0.1")).EndKey().Verdict(expr.VerdictGoto, strings.Repeat("c", 200)).String(): 1,
		NewID(nil).Addr(netip.MustParseAddr("fd00::1")).EndKey().Verdict(expr.VerdictDrop, "").String():                        1,
	}
	for _, c := range []struct {
		name string
		m    map[string]uint32
	}{
		{"one element", map[string]uint32{v4ID(1): 1}},
		{"10,000 addresses", many},
		{"values other than 1", counted},
		{"ids of two lengths, one past 127 bytes", long},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := pack(c.m)
			if p.n != len(c.m) {
				t.Fatalf("n = %d, want %d", p.n, len(c.m))
			}
			for id, v := range c.m {
				if got, ok := p.get(id); !ok || got != v {
					t.Errorf("get(%q) = %d, %v; want %d", id, got, ok, v)
				}
			}
			for _, absent := range []string{v4ID(1 << 20), "", "\x04"} {
				if _, ok := p.get(absent); ok {
					t.Errorf("get(%q) found an element the map lacks", absent)
				}
			}
			seen := map[string]uint32{}
			for id, v := range p.all {
				if _, dup := seen[id]; dup {
					t.Errorf("all yielded %q twice", id)
				}
				seen[id] = v
			}
			if !maps.Equal(seen, c.m) {
				t.Errorf("all yielded %d elements, not the map's %d", len(seen), len(c.m))
			}
			if !maps.Equal(p.thaw(), c.m) {
				t.Error("thawed, the elements differ from the map's")
			}
		})
	}
}

// TestAPackedSetBuiltWholeHoldsEachIDOnce: built from ids given one by
// one (each twice, from a reused buffer, with too small a size hint, so
// that the index grows), it is the set of those ids.
func TestAPackedSetBuiltWholeHoldsEachIDOnce(t *testing.T) {
	for _, n := range []int{0, 1, 7, 10000} {
		want := map[string]uint32{}
		for i := range n {
			want[v4ID(i)] = 1
		}
		s := PackedSet("s", SetSpec{}, n/10, func(add func([]byte)) {
			buf := make([]byte, 0, MaxIDLen)
			for range 2 {
				for id := range want {
					buf = append(buf[:0], id...)
					add(buf)
				}
			}
		})
		got := maps.Collect(s.All())
		if s.Len() != n || !maps.Equal(got, want) {
			t.Errorf("%d ids: the set holds %d (%d distinct), not the ids given", n, s.Len(), len(got))
		}
		for id := range want {
			if s.Value(id) != 1 {
				t.Errorf("%d ids: %q not found", n, id)
				break
			}
		}
	}
}

// TestPackedAddressesTakeAThirdOfAMap: the NetworkPolicy feature's sets
// are mostly addresses; as a map each took 37 bytes.
func TestPackedAddressesTakeAThirdOfAMap(t *testing.T) {
	m := map[string]uint32{}
	for i := range 100000 {
		m[v4ID(i)] = 1
	}
	p := pack(m)
	per := float64(cap(p.data)+4*cap(p.index)) / float64(len(m))
	t.Logf("%.1f bytes per IPv4 address", per)
	if per > 17 {
		t.Errorf("packed, an IPv4 address takes %.1f bytes; want at most 17", per)
	}
}

// TestAKeptTableIsPackedAndStillChanges follows a desired table a feature
// keeps across syncs, as the proxy and NetworkPolicy do: a set that went
// one sync unchanged is packed, and a change to it afterwards reaches the
// kernel and the fake alike, while the programmer's record keeps what the
// kernel had.
func TestAKeptTableIsPackedAndStillChanges(t *testing.T) {
	_, dial := kernelNS(t)
	b := newBoth(t, dial, "packed")
	s := base
	s.addrs = 50
	want := s.table(b.name)
	b.sync("first", want, true, nil)
	b.sync("unchanged", want, false, nil)
	if want.Sets["addrs"].packed == nil || want.Sets["addrs"].Elements != nil {
		t.Fatal("a set unchanged across a sync was not packed")
	}

	touched := NewTouched()
	addrs := want.Sets["addrs"].Mutable()
	delete(addrs, sampleAddr(3))
	addrs[sampleAddr(1000)] = 1
	touched.Elem("addrs", sampleAddr(3))
	touched.Elem("addrs", sampleAddr(1000))
	if st := b.sync("a packed set changed, a partial sync", want, false, touched); st.Messages == 0 {
		t.Error("the change sent nothing: the record took the change before the kernel did")
	}

	exp := s.table(b.name)
	m := exp.Sets["addrs"].Mutable()
	delete(m, sampleAddr(3))
	m[sampleAddr(1000)] = 1
	if diff := cmp.Diff(exp.Dump(), b.fake.Dump()); diff != "" {
		t.Errorf("the fake's table is not the changed one (-want +fake):\n%s", diff)
	}
	if got := want.Sets["addrs"].Len(); got != 50 {
		t.Errorf("the kept set holds %d elements, want 50", got)
	}
}

// BenchmarkPackedSet is what a set of n verdict-map elements costs each
// way: packed after a sync that did not change it, thawed by the next
// change; "clone" is the copy a change made of an adopted map before.
func BenchmarkPackedSet(b *testing.B) {
	for _, n := range []int{1000, 100000} {
		m := map[string]uint32{}
		for i := range n {
			a := netip.AddrFrom4([4]byte{172, 30, byte(i >> 8), byte(i)})
			m[NewID(nil).Addr(a).Proto(6).Port(80).EndKey().Verdict(expr.VerdictGoto, "service-0123456789abcdef").String()] = 1
		}
		p := pack(m)
		b.Run(fmt.Sprintf("%d/pack", n), func(b *testing.B) {
			for b.Loop() {
				pack(m)
			}
		})
		b.Run(fmt.Sprintf("%d/thaw", n), func(b *testing.B) {
			for b.Loop() {
				p.thaw()
			}
		})
		b.Run(fmt.Sprintf("%d/clone", n), func(b *testing.B) {
			for b.Loop() {
				_ = maps.Clone(m)
			}
		})
	}
}
