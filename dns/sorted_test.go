package dns

import (
	"maps"
	"math/rand/v2"
	"testing"
)

// TestSortedMapAgreesWithAMap: random sets, deletes and sweeps, on a
// sortedMap in place and through editors, agree with a Go map; an editor
// never changes the map it started from.
func TestSortedMapAgreesWithAMap(t *testing.T) {
	for _, tc := range []struct {
		name string
		keys uint32 // keys are drawn from [0, keys)
		ops  int
	}{
		{"a few keys, many changes each", 50, 5_000},
		{"many keys, shards of hundreds", 200_000, 100_000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, 2))
			in, want := &sortedMap[uint32, uint32]{}, map[uint32]uint32{}
			shared := &sortedMap[uint32, uint32]{}
			for op := range tc.ops {
				k, v := r.Uint32N(tc.keys), r.Uint32()
				if op%3 == 2 {
					in.del(k)
					delete(want, k)
				} else {
					in.set(k, v)
					want[k] = v
				}
				if op%1000 == 999 { // through an editor, checking its base stays
					before := collect(shared)
					e := editSorted(shared)
					for k, v := range want {
						e.set(k, v)
					}
					for k := range before {
						if _, ok := want[k]; !ok {
							e.del(k)
						}
					}
					if !maps.Equal(collect(shared), before) {
						t.Fatal("an editor changed its base")
					}
					shared = e.result()
				}
			}
			if got := collect(shared); !maps.Equal(got, want) {
				t.Errorf("through editors: %d entries, want %d", len(got), len(want))
			}
			in.deleteFunc(func(k, v uint32) bool { return k%2 == 0 })
			maps.DeleteFunc(want, func(k, v uint32) bool { return k%2 == 0 })
			if got := collect(in); !maps.Equal(got, want) {
				t.Errorf("in place: %d entries, want %d", len(got), len(want))
			}
			for k, v := range want {
				if got, ok := in.get(k); !ok || got != v {
					t.Fatalf("get(%d) = %d, %v; want %d", k, got, ok, v)
				}
			}
			if in.len() != len(want) {
				t.Errorf("len %d, want %d", in.len(), len(want))
			}
			for i, s := range in.shards {
				for j := 1; j < len(s); j++ {
					if s[j-1].k >= s[j].k {
						t.Fatalf("shard %d is out of order at %d", i, j)
					}
				}
			}
		})
	}
}

func collect(m *sortedMap[uint32, uint32]) map[uint32]uint32 {
	out := map[uint32]uint32{}
	m.update(func(k uint32, v *uint32) { out[k] = *v })
	return out
}
