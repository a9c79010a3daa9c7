package proxy

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
	"github.com/netplane/netplane/nft"
	"github.com/netplane/netplane/nodeview"
)

// BenchmarkRender measures the programmer alone in a throwaway namespace, at
// 1,000 and 10,000 Services × 10 endpoints (IPv4 family): a full sync into
// an empty namespace, a full sync over a correct table (the periodic
// resync), a restart's first sync adopting that table, and a partial sync
// of one changed EndpointSlice.
func BenchmarkRender(b *testing.B) {
	framework.RequireRoot(b)
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			in := scaleInput(n)
			m := NewModel()
			want := m.Build(in).Tables[nodeview.IPv4]
			b.Run("from-empty", func(b *testing.B) {
				for b.Loop() {
					dial := benchNS(b)
					r := nft.NewProgrammer(dial, ip4Table)
					mustSync(b, r, want, true)
					r.Close()
				}
			})
			dial := benchNS(b)
			r := nft.NewProgrammer(dial, ip4Table)
			b.Cleanup(r.Close)
			mustSync(b, r, want, true)
			b.Run("full-unchanged", func(b *testing.B) {
				for b.Loop() {
					mustSync(b, r, want, true)
				}
			})
			b.Run("restart-adopt", func(b *testing.B) {
				for b.Loop() {
					r2 := nft.NewProgrammer(dial, ip4Table)
					mustSync(b, r2, want, true)
					r2.Close()
				}
			})
			key := nsName("bench", "svc7")
			b.Run("partial-one-change", func(b *testing.B) {
				i := 0
				for b.Loop() {
					i++ // a new address every time, so every sync changes the kernel
					s := *in.Slices[key][0]
					s.endpoints = slices.Clone(s.endpoints)
					s.endpoints[0].addr = netip.AddrFrom4([4]byte{10, 99, byte(i / 250 % 200), byte(i%250 + 1)})
					in.Slices[key] = []*sliceRecord{&s}
					mustSync(b, r, m.Build(in).Tables[nodeview.IPv4], false)
				}
			})
		})
	}
}

var ip4Table = tableIDs()[0]

func mustSync(b *testing.B, r nft.Syncer, want *nft.Table, full bool) nft.Stats {
	b.Helper()
	st, err := r.Sync(want, full)
	if err != nil {
		b.Fatal(err)
	}
	return st
}

// benchNS is a throwaway namespace deleted when the benchmark ends.
func benchNS(b testing.TB) nft.Dialer {
	b.Helper()
	ns := netns.New(b, "rbench")
	d, closeNS, err := nft.NamespaceDialer(ns.Path)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = closeNS() })
	return d
}
