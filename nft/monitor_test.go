package nft

import (
	"slices"
	"sync"
	"testing"

	"github.com/google/nftables"
)

// TestWatchAwayCountsCommitsByGeneration: while the programmers commit, the
// monitor is away from the multicast group; the generation must then account
// for every commit, or every family counts as changed.
func TestWatchAwayCountsCommitsByGeneration(t *testing.T) {
	ns, dial := kernelNS(t)
	ip4, ip6 := TableID{nftables.TableFamilyIPv4, testName}, TableID{nftables.TableFamilyIPv6, testName}
	w := newMonitor(dial, []TableID{ip4, ip6})
	t.Cleanup(w.Close)
	bw, err := newBatchWriter(dial)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(bw.Close)
	add := func(bw *batchWriter, fam nftables.TableFamily, name string) func() error {
		return func() error {
			bw.library().AddTable(&nftables.Table{Name: name, Family: fam})
			return bw.Flush()
		}
	}
	ours := func(name string) func() error { return add(bw, nftables.TableFamilyIPv4, name) }
	other, err := newBatchWriter(dial) // another socket: someone else to the watch
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(other.Close)
	steps := []struct {
		name    string
		nft     []string     // run while listening, before the step
		fn      func() error // runs while away
		ip, ip6 bool         // changed afterwards
	}{
		{name: "nothing", fn: func() error { return nil }},
		{name: "our own commit, counted", fn: ours(testName)},
		{name: "our own commit of the other family's table, counted", fn: add(bw, nftables.TableFamilyIPv6, testName)},
		{name: "another table changed while listening", nft: []string{"add", "table", "ip", "other"}, fn: ours("x")},
		{name: "our ip6 table changed while listening", nft: []string{"add", "chain", "ip6", testName, "stray"}, fn: ours("y"), ip6: true},
		{name: "someone commits while away, even elsewhere", fn: func() error {
			ns.MustExec(t, "nft", "add", "table", "ip", "elsewhere")
			return nil
		}, ip: true, ip6: true},
		{name: "a commit on another writer's socket looks like someone else's", fn: add(other, nftables.TableFamilyIPv4, "z"), ip: true, ip6: true},
		{name: "a new table", fn: ours("zz0")},
		{name: "our commit that changes nothing (the table is there) commits nothing", fn: ours("zz0")},
		{name: "someone commits while ours changes nothing", fn: func() error {
			err := ours("zz0")()
			ns.MustExec(t, "nft", "add", "table", "ip", "elsewhere2")
			return err
		}, ip: true, ip6: true},
		{name: "quiet again", fn: ours("zz")},
	}
	w.open()
	w.changed(ip4)
	w.changed(ip6)
	for _, s := range steps {
		if s.nft != nil {
			ns.MustExec(t, "nft", s.nft...)
		}
		if err := w.away(bw, s.fn); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if got := w.changed(ip4); got != s.ip {
			t.Errorf("%s: ip changed %v, want %v", s.name, got, s.ip)
		}
		if got := w.changed(ip6); got != s.ip6 {
			t.Errorf("%s: ip6 changed %v, want %v", s.name, got, s.ip6)
		}
	}
}

// TestMonitorWatchesOnlyItsTables: a monitor counts changes to the tables
// it was given, of any family, and ignores other tables, even of the same
// name in another family.
func TestMonitorWatchesOnlyItsTables(t *testing.T) {
	ns, dial := kernelNS(t)
	pods := TableID{nftables.TableFamilyINet, "pods"}
	w := newMonitor(dial, []TableID{pods})
	t.Cleanup(w.Close)
	w.open()
	w.changed(pods)
	for _, c := range []struct {
		nft     string
		changed bool
	}{
		{"add table ip pods", false},
		{"add table inet other", false},
		{"add table inet pods", true},
		{"add chain ip pods c", false},
		{"add chain inet pods c", true},
		{"flush ruleset", true},
	} {
		ns.MustExec(t, "nft", c.nft)
		if got := w.changed(pods); got != c.changed {
			t.Errorf("after nft %s: changed %v, want %v", c.nft, got, c.changed)
		}
	}
}

// TestProgrammersOfTheOwnNamespaceShareOneMonitor: the node role builds the
// proxy's and the NetworkPolicy programmers in separate calls; in the
// process's own namespace they still share one monitor, so that neither
// listens while the other commits (which costs the kernel a notification
// per object committed).
func TestProgrammersOfTheOwnNamespaceShareOneMonitor(t *testing.T) {
	a := NewProgrammer(Dialer{}, TableID{nftables.TableFamilyIPv4, "shared-a"})
	b := NewProgrammers(Dialer{}, TableID{nftables.TableFamilyINet, "shared-b"})[0]
	if a.k.(*netlinkKernel).mon != b.k.(*netlinkKernel).mon {
		t.Errorf("two programmers of the own namespace have a monitor each, want one shared")
	}
	own.mu.Lock()
	defer own.mu.Unlock()
	for _, id := range []TableID{a.id, b.id} {
		if !slices.Contains(own.tables, id) || !own.dirty[id] {
			t.Errorf("the shared monitor watches %v (changed: %v); want it to watch %s and count it changed", own.tables, own.dirty, id)
		}
	}
}

// TestProgrammersSharingAMonitorSyncSideBySide: two programmers of one
// namespace sharing a monitor sync at the same time; each commit is away
// from the group and accounted to its own writer, so neither counts the
// other's commits as a change by someone else, and a full sync after
// trusts its record instead of reading the table back.
func TestProgrammersSharingAMonitorSyncSideBySide(t *testing.T) {
	ns, dial := kernelNS(t)
	ids := []TableID{{nftables.TableFamilyIPv4, "one"}, {nftables.TableFamilyIPv4, "two"}}
	ps := programmersOn(newMonitor(dial, ids), ids)
	for _, p := range ps {
		t.Cleanup(p.Close)
		if _, err := p.Sync(base.table(p.id.Name), true); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2*20)
	for _, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				s := base
				s.addrs = 3 + i%5
				if _, err := p.Sync(s.table(p.id.Name), false); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, p := range ps {
		s := base
		s.addrs = 3 + 19%5
		st, err := p.Sync(s.table(p.id.Name), true)
		if err != nil || st.ReadBack || st.Messages != 0 {
			t.Errorf("table %s: full sync after side-by-side syncs read back %v, sent %d messages (%v); want neither\n%s",
				p.id, st.ReadBack, st.Messages, err, ns.MustExec(t, "nft", "list", "ruleset"))
		}
	}
}
