package proxy

import (
	"testing"

	"github.com/google/nftables"
)

// TestWatchAwayCountsCommitsByGeneration: while the renderers commit, the
// watch is away from the multicast group; the generation must then account
// for every commit, or every family counts as changed.
func TestWatchAwayCountsCommitsByGeneration(t *testing.T) {
	ns, dial := kernelNS(t)
	w := newForeignWatch(dial)
	t.Cleanup(w.Close)
	bw, err := newBatchWriter(dial)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(bw.Close)
	ours := func(name string) func() (int, error) {
		return func() (int, error) {
			before := bw.commits
			bw.library().AddTable(&nftables.Table{Name: name, Family: nftables.TableFamilyIPv4})
			err := bw.Flush()
			return bw.commits - before, err
		}
	}
	steps := []struct {
		name    string
		nft     []string            // run while listening, before the step
		fn      func() (int, error) // runs while away
		ip, ip6 bool                // changed afterwards
	}{
		{name: "nothing", fn: func() (int, error) { return 0, nil }},
		{name: "our own commit, counted", fn: ours(TableName)},
		{name: "our own commit of the other family's table, counted", fn: func() (int, error) {
			before := bw.commits
			bw.library().AddTable(&nftables.Table{Name: TableName, Family: nftables.TableFamilyIPv6})
			err := bw.Flush()
			return bw.commits - before, err
		}},
		{name: "another table changed while listening", nft: []string{"add", "table", "ip", "other"}, fn: ours("x")},
		{name: "our ip6 table changed while listening", nft: []string{"add", "chain", "ip6", TableName, "stray"}, fn: ours("y"), ip6: true},
		{name: "someone commits while away, even elsewhere", fn: func() (int, error) {
			ns.MustExec(t, "nft", "add", "table", "ip", "elsewhere")
			return 0, nil
		}, ip: true, ip6: true},
		{name: "an uncounted commit of ours looks like someone else's", fn: func() (int, error) {
			_, err := ours("z")()
			return 0, err
		}, ip: true, ip6: true},
		{name: "a new table", fn: ours("zz0")},
		{name: "our commit that changes nothing (the table is there) commits nothing", fn: ours("zz0")},
		{name: "someone commits while ours changes nothing", fn: func() (int, error) {
			n, err := ours("zz0")()
			ns.MustExec(t, "nft", "add", "table", "ip", "elsewhere2")
			return n, err
		}, ip: true, ip6: true},
		{name: "quiet again", fn: ours("zz")},
	}
	w.open()
	w.changed(nftables.TableFamilyIPv4)
	w.changed(nftables.TableFamilyIPv6)
	for _, s := range steps {
		if s.nft != nil {
			ns.MustExec(t, "nft", s.nft...)
		}
		if err := w.away(bw.generation, s.fn); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if got := w.changed(nftables.TableFamilyIPv4); got != s.ip {
			t.Errorf("%s: ip changed %v, want %v", s.name, got, s.ip)
		}
		if got := w.changed(nftables.TableFamilyIPv6); got != s.ip6 {
			t.Errorf("%s: ip6 changed %v, want %v", s.name, got, s.ip6)
		}
	}
}
