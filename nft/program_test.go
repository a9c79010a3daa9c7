package nft

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// sample is the shape of a small table of every kind of object a feature
// uses: a base chain jumping to a regular one, a set, a verdict map, a data
// map read by a DNAT, a dynamic set, an anonymous interval set.
type sample struct {
	addrs   int           // elements of the set "addrs"
	dropped bool          // the verdict map's second element drops instead of going to chain "b"
	chainB  bool          // chain "b" is there, and the map leads to it
	accept  string        // the prefix chain "a" accepts
	timeout time.Duration // of the dynamic set "clients"
	prio    int32         // of the base chain
}

var base = sample{addrs: 3, chainB: true, accept: "10.0.0.0/8", timeout: time.Minute}

func (s sample) table(name string) *Table {
	const fam = nftables.TableFamilyIPv4
	t := NewTable(fam, name)
	addrs := t.Set("addrs", SetSpec{Key: nftables.TypeIPAddr}).Mutable()
	for i := range s.addrs {
		addrs[NewID(nil).Addr(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})).String()] = 1
	}
	vip := nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetService)
	dispatch := t.Set("dispatch", SetSpec{Key: nftables.TypeIPAddr, Data: nftables.TypeVerdict}).Mutable()
	dispatch[NewID(nil).Addr(netip.MustParseAddr("10.9.0.1")).EndKey().Verdict(expr.VerdictGoto, "a").String()] = 1
	second := NewID(nil).Addr(netip.MustParseAddr("10.9.0.2")).EndKey()
	switch {
	case s.dropped:
		dispatch[second.Verdict(expr.VerdictDrop, "").String()] = 1
	case s.chainB:
		dispatch[second.Verdict(expr.VerdictGoto, "b").String()] = 1
	}
	backends := t.Set("backends", SetSpec{Key: vip, Data: vip}).Mutable()
	backends[NewID(nil).Addr(netip.MustParseAddr("10.96.0.1")).Port(80).EndKey().Addr(netip.MustParseAddr("10.244.0.7")).Port(8080).String()] = 1
	t.Set("clients", SetSpec{Key: nftables.TypeIPAddr, Dynamic: true, Timeout: s.timeout})

	t.Chain("input", &Hook{Type: nftables.ChainTypeFilter, Hook: *nftables.ChainHookInput, Priority: s.prio})
	t.AddRule("input", NewRule(fam).CtState(expr.CtStateBitNEW).Jump("a").Rule())
	t.AddRule("input", NewRule(fam).Vmap("dispatch", Daddr).Rule())
	t.Chain("a", nil)
	t.AddRule("a", NewRule(fam).Lookup("addrs", Saddr).Drop().Rule())
	t.AddRule("a", NewRule(fam).Update("clients", Saddr, s.timeout).Rule())
	t.AddRule("a", NewRule(fam).MatchPrefixes(Saddr, []netip.Prefix{netip.MustParsePrefix(s.accept), netip.MustParsePrefix("192.168.0.0/16")}, false).Accept().Rule())
	if s.chainB && !s.dropped {
		t.Chain("b", nil)
		t.AddRule("b", NewRule(fam).Counter().Accept().Rule())
	}
	t.Chain("dnat", &Hook{Type: nftables.ChainTypeNAT, Hook: *nftables.ChainHookPrerouting, Priority: -100})
	r := NewRule(fam).L4Proto(unix.IPPROTO_TCP)
	t.AddRule("dnat", r.Add("dnat ip to ip daddr . th dport map @backends", append(r.Load(Daddr, THDport),
		&expr.Lookup{SourceRegister: Reg, SetName: "backends", IsDestRegSet: true, DestRegister: Reg}, r.NAT())...).Rule())
	return t
}

// both is a table programmed twice, in a namespace's kernel and in a fake.
type both struct {
	t      *testing.T
	name   string
	kernel *Programmer
	fake   *Fake
	dial   Dialer
}

func newBoth(t *testing.T, dial Dialer, name string) *both {
	id := TableID{nftables.TableFamilyIPv4, name}
	b := &both{t: t, name: name, kernel: NewProgrammer(dial, id), fake: NewFake(id), dial: dial}
	t.Cleanup(b.kernel.Close)
	return b
}

// sync syncs want on both and checks they sent the same, that the fake's
// table is want, and that a new programmer finds the kernel's table equal
// to want (it sends nothing).
func (b *both) sync(step string, want *Table, full bool, touched *Touched) Stats {
	b.t.Helper()
	run := func(s Syncer) (Stats, error) {
		if touched != nil {
			return s.SyncTouched(want, touched)
		}
		return s.Sync(want, full)
	}
	st, err := run(b.kernel)
	if err != nil {
		b.t.Fatalf("%s: kernel: %v", step, err)
	}
	fst, err := run(b.fake)
	if err != nil {
		b.t.Fatalf("%s: fake: %v\n%s", step, err, b.fake.Dump())
	}
	if st != fst {
		b.t.Errorf("%s: the kernel's sync sent %+v, the fake's %+v", step, st, fst)
	}
	if diff := cmp.Diff(want.Dump(), b.fake.Dump()); diff != "" {
		b.t.Errorf("%s: the fake's table differs from the desired one (-want +fake):\n%s", step, diff)
	}
	fresh := NewProgrammer(b.dial, want.ID())
	defer fresh.Close()
	if st, err := fresh.Sync(want, true); err != nil || st.Messages != 0 {
		b.t.Errorf("%s: a new programmer sent %d messages (%v) over the kernel's table; want 0", step, st.Messages, err)
	}
	return st
}

// TestProgrammerConvergesTheKernelAndTheFakeAlike syncs a table through
// changes of every kind, to the kernel and to the fake: both send the same
// messages, the fake ends with the desired table and the kernel with one a
// new programmer adopts as is.
func TestProgrammerConvergesTheKernelAndTheFakeAlike(t *testing.T) {
	_, dial := kernelNS(t)
	b := newBoth(t, dial, "sample")
	s := base
	if st := b.sync("from empty", s.table(b.name), true, nil); st.Messages == 0 || !st.ReadBack {
		t.Errorf("the first sync: %+v; want messages, after a read-back", st)
	}
	if st := b.sync("unchanged", s.table(b.name), false, nil); st.Messages != 0 {
		t.Errorf("an unchanged table sent %d messages", st.Messages)
	}
	s.addrs = 5
	touched := NewTouched()
	want := s.table(b.name)
	for id := range want.Sets["addrs"].All() {
		touched.Elem("addrs", id)
	}
	if st := b.sync("two elements more, a partial sync", want, false, touched); st.Messages != 1 {
		t.Errorf("two elements more sent %d messages, want 1", st.Messages)
	}
	for _, c := range []struct {
		step   string
		change func(*sample)
		full   bool
	}{
		{"a verdict replaced by another", func(s *sample) { s.dropped = true }, false},
		{"a chain removed", func(s *sample) { s.chainB, s.dropped = false, false }, false},
		{"a chain added back", func(s *sample) { s.chainB = true }, false},
		{"a rule changed", func(s *sample) { s.accept = "172.16.0.0/12" }, false},
		{"a base chain's priority changed", func(s *sample) { s.prio = 10 }, false},
		{"a set outgrows its size", func(s *sample) { s.addrs = 300 }, false},
		{"a set far below its size, shrunk by a full sync", func(s *sample) { s.addrs = 10 }, true},
		{"a dynamic set's timeout changed", func(s *sample) { s.timeout = 2 * time.Minute }, false},
	} {
		c.change(&s)
		b.sync(c.step, s.table(b.name), c.full, nil)
	}
}

// TestFakeAndKernelRefuseTheSameTables: tables the kernel refuses, the fake
// refuses too, and leaves its table as it was.
func TestFakeAndKernelRefuseTheSameTables(t *testing.T) {
	_, dial := kernelNS(t)
	for i, c := range []struct {
		name  string
		spoil func(t *Table)
		errno unix.Errno
	}{
		{"a jump to a chain that is not there", func(t *Table) { t.AddRule("a", NewRule(t.Family).Jump("missing").Rule()) }, unix.ENOENT},
		{"a goto to a base chain", func(t *Table) { t.AddRule("a", NewRule(t.Family).Goto("input").Rule()) }, unix.EOPNOTSUPP},
		{"a lookup of a set that is not there", func(t *Table) { t.AddRule("a", NewRule(t.Family).Lookup("missing", Saddr).Drop().Rule()) }, unix.ENOENT},
		{"a vmap of a plain set", func(t *Table) { t.AddRule("a", NewRule(t.Family).Vmap("addrs", Saddr).Rule()) }, unix.EINVAL},
		{"an update of a set that is not dynamic", func(t *Table) { t.AddRule("a", NewRule(t.Family).Update("addrs", Saddr, time.Minute).Rule()) }, unix.EOPNOTSUPP},
		{"a map element leading to a chain that is not there", func(t *Table) {
			t.Sets["dispatch"].Mutable()[NewID(nil).Addr(netip.MustParseAddr("10.9.0.3")).EndKey().Verdict(expr.VerdictGoto, "missing").String()] = 1
		}, unix.ENOENT},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := newBoth(t, dial, fmt.Sprintf("refused-%d", i))
			good := base.table(b.name)
			b.sync("a good table first", good, true, nil)
			before := b.fake.Dump()
			bad := base.table(b.name)
			c.spoil(bad)
			_, kerr := b.kernel.Sync(bad, false)
			_, ferr := b.fake.Sync(bad, false)
			if !errors.Is(kerr, c.errno) {
				t.Errorf("the kernel's answer: %v; want %v", kerr, c.errno)
			}
			if !errors.Is(ferr, c.errno) {
				t.Errorf("the fake's answer: %v; want %v, as the kernel", ferr, c.errno)
			}
			if after := b.fake.Dump(); after != before {
				t.Errorf("the fake's table changed:\n%s", cmp.Diff(before, after))
			}
		})
	}
}
