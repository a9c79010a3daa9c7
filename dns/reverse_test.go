package dns

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
)

// TestPtrIndexKeepsTheNamersInOrder: the Services naming an address come
// back in the order they came, whichever of them leaves, and an index
// already made never changes.
func TestPtrIndexKeepsTheNamersInOrder(t *testing.T) {
	a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1")
	x, y, z := svcKey{"ns", "x"}, svcKey{"ns", "y"}, svcKey{"other", "x"}
	type op struct {
		add  bool
		addr netip.Addr
		k    svcKey
	}
	add := func(a netip.Addr, k svcKey) op { return op{true, a, k} }
	del := func(a netip.Addr, k svcKey) op { return op{false, a, k} }
	for _, c := range []struct {
		name  string
		ops   []op
		wantA []svcKey
		wantB []svcKey
	}{
		{"one namer", []op{add(a, x)}, []svcKey{x}, nil},
		{"three namers in order", []op{add(a, x), add(a, y), add(a, z)}, []svcKey{x, y, z}, nil},
		{"the first leaves", []op{add(a, x), add(a, y), add(a, z), del(a, x)}, []svcKey{y, z}, nil},
		{"a middle one leaves", []op{add(a, x), add(a, y), add(a, z), del(a, y)}, []svcKey{x, z}, nil},
		{"the last leaves", []op{add(a, x), add(a, y), del(a, y)}, []svcKey{x}, nil},
		{"all leave", []op{add(a, x), add(a, y), del(a, x), del(a, y)}, nil, nil},
		{"one that never named it", []op{add(a, x), del(a, y), del(b, x)}, []svcKey{x}, nil},
		{"addresses apart", []op{add(a, x), add(b, y), add(b, x), del(a, x)}, nil, []svcKey{y, x}},
		{"leaves and comes back last", []op{add(a, x), add(a, y), del(a, x), add(a, x)}, []svcKey{y, x}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			ix := newPtrIndex()
			var seen []ptrIndex
			var want [][2][]svcKey
			for _, o := range c.ops {
				seen = append(seen, ix)
				want = append(want, [2][]svcKey{ix.namers(a), ix.namers(b)})
				e := ix.edit()
				if o.add {
					e.add(o.addr, &o.k)
				} else {
					e.remove(o.addr, o.k)
				}
				ix = e.done()
			}
			if got := ix.namers(a); !slices.Equal(got, c.wantA) {
				t.Errorf("%s named by %v, want %v", a, got, c.wantA)
			}
			if got := ix.namers(b); !slices.Equal(got, c.wantB) {
				t.Errorf("%s named by %v, want %v", b, got, c.wantB)
			}
			for i, old := range seen {
				got := [2][]svcKey{old.namers(a), old.namers(b)}
				if fmt.Sprint(got) != fmt.Sprint(want[i]) {
					t.Errorf("the index before step %d changed: %v, was %v", i, got, want[i])
				}
			}
		})
	}
}
