package nft

import (
	"fmt"
	"maps"
	"slices"
	"strings"
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
		if got := w.changed(ip4).some(); got != s.ip {
			t.Errorf("%s: ip changed %v, want %v", s.name, got, s.ip)
		}
		if got := w.changed(ip6).some(); got != s.ip6 {
			t.Errorf("%s: ip6 changed %v, want %v", s.name, got, s.ip6)
		}
	}
}

// TestMonitorWatchesOnlyItsTables: a monitor counts changes to the tables
// it was given, of any family, and ignores other tables, even of the same
// name in another family; rules and elements count against their chain
// and set alone, anything else against the whole table.
func TestMonitorWatchesOnlyItsTables(t *testing.T) {
	ns, dial := kernelNS(t)
	pods := TableID{nftables.TableFamilyINet, "pods"}
	w := newMonitor(dial, []TableID{pods})
	t.Cleanup(w.Close)
	w.open()
	w.changed(pods)
	for _, c := range []struct {
		nft     string
		changed string
	}{
		{"add table ip pods", ""},
		{"add table inet other", ""},
		{"add table inet pods", "all"},
		{"add chain ip pods c", ""},
		{"add chain inet pods c", "all"},
		{"add chain inet pods d", "all"},
		{"add set inet pods s { type ipv4_addr; }", "all"},
		{"add rule inet pods c accept", "chains [c]"},
		{"insert rule inet pods d drop", "chains [d]"},
		{"add element inet pods s { 10.0.0.1, 10.0.0.2 }", "sets [s]"},
		{"delete element inet pods s { 10.0.0.1 }", "sets [s]"},
		{"add chain inet other c; add rule inet other c accept", ""},
		{"flush chain inet pods c", "chains [c]"},
		{"add rule inet pods c accept; add element inet pods s { 10.0.0.3 }", "chains [c] sets [s]"},
		{"add rule inet pods c accept; add chain inet pods e", "all"},
		{"flush ruleset", "all"},
	} {
		ns.MustExec(t, "nft", c.nft)
		if got := describe(w.changed(pods)); got != c.changed {
			t.Errorf("after nft %s: changed %q, want %q", c.nft, got, c.changed)
		}
	}
}

// describe says what others changed, as the monitor tests expect it.
func describe(f *foreign) string {
	switch {
	case !f.some():
		return ""
	case f.all:
		return "all"
	}
	var out []string
	for _, part := range []struct {
		what  string
		names map[string]bool
	}{{"chains", f.chains}, {"sets", f.sets}} {
		if len(part.names) > 0 {
			out = append(out, fmt.Sprintf("%s %v", part.what, slices.Sorted(maps.Keys(part.names))))
		}
	}
	return strings.Join(out, " ")
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
		if !slices.Contains(own.tables, id) || own.dirty[id] == nil || !own.dirty[id].all {
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

// TestAFullSyncReadsBackOnlyWhatOthersChanged: after others changed rules
// of one chain and elements of one set, a full sync reads those back alone
// and repairs them; after they made a chain it reads the whole table back.
func TestAFullSyncReadsBackOnlyWhatOthersChanged(t *testing.T) {
	ns, dial := kernelNS(t)
	p := NewProgrammer(dial, TableID{nftables.TableFamilyIPv4, testName})
	t.Cleanup(p.Close)
	want := base.table(testName)
	if _, err := p.Sync(want, true); err != nil {
		t.Fatal(err)
	}
	clean := ns.MustExec(t, "nft", "list", "table", "ip", testName)
	for _, s := range []struct {
		name     string
		nft      string
		reread   int
		readBack bool
	}{
		{"untouched", "", 0, false},
		{"a rule inserted", "insert rule ip " + testName + " a accept", 1, false},
		{"a rule of ours deleted, an element added", "flush chain ip " + testName + " b; add element ip " + testName + " addrs { 10.7.7.7 }", 2, false},
		{"elements of ours deleted, a set of the kernel's own changed", "delete element ip " + testName + " addrs { 10.1.0.1 }; add element ip " + testName + " clients { 10.8.8.8 }", 1, false},
		{"a chain made", "add chain ip " + testName + " stray", 0, true},
	} {
		if s.nft != "" {
			ns.MustExec(t, "nft", s.nft)
		}
		st, err := p.Sync(want, true)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if st.Reread != s.reread || st.ReadBack != s.readBack {
			t.Errorf("%s: full sync reread %d parts, read the table back %v; want %d, %v", s.name, st.Reread, st.ReadBack, s.reread, s.readBack)
		}
		if got := ns.MustExec(t, "nft", "list", "table", "ip", testName); withoutClients(got) != withoutClients(clean) {
			t.Errorf("%s: the table was not repaired:\n%s\nwant\n%s", s.name, got, clean)
		}
	}
}

// withoutClients is a listing without the elements of the dynamic set
// "clients", which the kernel's own and nobody repairs.
func withoutClients(listing string) string {
	var out []string
	inClients := false
	for _, l := range strings.Split(listing, "\n") {
		switch {
		case strings.Contains(l, "set clients"):
			inClients = true
		case inClients && strings.TrimSpace(l) == "}":
			inClients = false
		case inClients && strings.Contains(l, "elements"):
			continue
		}
		out = append(out, l)
	}
	return strings.Join(out, "\n")
}
