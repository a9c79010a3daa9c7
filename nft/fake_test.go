package nft

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// TestFakeRefusesStepsOutOfOrder: the fake refuses, as the kernel does, the
// steps a plan in the wrong order would send, so that a test of a feature's
// syncs on the fake also checks the programmer's order.
func TestFakeRefusesStepsOutOfOrder(t *testing.T) {
	ipSpec := SetSpec{Key: nftables.TypeIPAddr}
	vmapSpec := SetSpec{Key: nftables.TypeIPAddr, Data: nftables.TypeVerdict}
	id1 := NewID(nil).Addr(netipAddr("10.0.0.1")).String()
	goA := NewID(nil).Addr(netipAddr("10.0.0.1")).EndKey().Verdict(expr.VerdictGoto, "a").String()
	dropIt := NewID(nil).Addr(netipAddr("10.0.0.1")).EndKey().Verdict(expr.VerdictDrop, "").String()
	for _, c := range []struct {
		name  string
		steps []step
		errno unix.Errno
	}{
		{"a set deleted while a rule reads it", []step{{op: opDelSet, name: "addrs"}}, unix.EBUSY},
		{"a chain deleted while a map's element leads to it", []step{{op: opDelChain, name: "a"}}, unix.EBUSY},
		{"a chain deleted while a rule jumps to it", []step{{op: opFlushChain, name: "c"}, {op: opDelChain, name: "c"}}, unix.EBUSY},
		{"an element added with another value", []step{{op: opElements, name: "dispatch", spec: &vmapSpec, ids: []string{dropIt}}}, unix.EEXIST},
		{"an element deleted that is not there", []step{{op: opElements, name: "addrs", spec: &ipSpec, ids: []string{id1}, del: true}}, unix.ENOENT},
		{"elements past the set's size", []step{{op: opElements, name: "small", spec: &ipSpec, ids: []string{id1, NewID(nil).Addr(netipAddr("10.0.0.2")).String()}}}, unix.ENFILE},
		{"a set added again as another kind", []step{{op: opAddSet, name: "addrs", spec: &vmapSpec}}, unix.EEXIST},
		{"a rule in a chain that is not there", []step{{op: opRewrite, chain: &Chain{Name: "missing"}}}, unix.ENOENT},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := NewFake(TableID{nftables.TableFamilyIPv4, testName})
			want := NewTable(nftables.TableFamilyIPv4, testName)
			want.Set("addrs", ipSpec)
			want.Set("dispatch", vmapSpec).Mutable()[goA] = 1
			want.Chain("a", nil) // the map leads there
			want.Chain("b", nil)
			want.Chain("c", nil) // b jumps there
			want.AddRule("b", NewRule(want.Family).Lookup("addrs", Saddr).Jump("c").Rule())
			if _, err := f.Sync(want, true); err != nil {
				t.Fatal(err)
			}
			f.k.t.sets["small"] = &fakeSet{spec: ipSpec, size: 1, elems: map[string]string{}}
			before := f.Dump()
			p := newPlan(f.applied)
			for _, s := range c.steps {
				s.messages, s.weight = 1, 1
				p.steps = append(p.steps, s)
			}
			if _, err := f.k.send(p); !errors.Is(err, c.errno) {
				t.Errorf("sent: %v; want %v", err, c.errno)
			}
			if after := f.Dump(); after != before {
				t.Errorf("a refused transaction changed the table:\n%s", cmp.Diff(before, after))
			}
		})
	}
}

// TestFakeFailureIsHealedByTheNextSync: a transaction that fails leaves the
// table as it was; the programmer then forgets what it knew, and the next
// sync, reading the table back, makes it the desired one.
func TestFakeFailureIsHealedByTheNextSync(t *testing.T) {
	s := base
	f := NewFake(TableID{nftables.TableFamilyIPv4, "sample"})
	if _, err := f.Sync(s.table("sample"), true); err != nil {
		t.Fatal(err)
	}
	before := f.Dump()
	s.addrs, s.chainB = 20, false
	want := s.table("sample")
	refused := errors.New("refused")
	f.Fail(refused)
	if _, err := f.Sync(want, false); !errors.Is(err, refused) {
		t.Fatalf("sync: %v; want the failure", err)
	}
	if f.Dump() != before {
		t.Errorf("the failed transaction changed the table:\n%s", cmp.Diff(before, f.Dump()))
	}
	st, err := f.Sync(want, false)
	if err != nil || !st.ReadBack {
		t.Fatalf("the sync after the failure: %+v, %v; want one that reads the table back", st, err)
	}
	if diff := cmp.Diff(want.Dump(), f.Dump()); diff != "" {
		t.Errorf("the table after the retry differs (-want +fake):\n%s", diff)
	}
}

// TestFakeEditsAreHealedByAFullSyncOnly: someone else's change is trusted
// away by a partial sync and repaired by a full one, as the monitor makes
// the programmer do on the kernel.
func TestFakeEditsAreHealedByAFullSyncOnly(t *testing.T) {
	want := base.table("sample")
	for _, c := range []struct {
		name string
		edit func(t *Table) *Table
	}{
		{"a chain flushed", func(t *Table) *Table { t.Chains["a"].Rules = nil; return t }},
		{"an element deleted", func(t *Table) *Table { clear(t.Sets["addrs"].Elements); return t }},
		{"a stray chain", func(t *Table) *Table { t.Chain("stray", nil); return t }},
		{"the table deleted", func(*Table) *Table { return nil }},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := NewFake(want.ID())
			if _, err := f.Sync(want, true); err != nil {
				t.Fatal(err)
			}
			f.Edit(c.edit)
			if st, err := f.Sync(want, false); err != nil || st.Messages != 0 {
				t.Errorf("a partial sync after the edit: %+v, %v; want nothing sent", st, err)
			}
			if st, err := f.Sync(want, true); err != nil || st.Messages == 0 {
				t.Errorf("a full sync after the edit: %+v, %v; want a repair", st, err)
			}
			if diff := cmp.Diff(want.Dump(), f.Dump()); diff != "" {
				t.Errorf("after the full sync (-want +fake):\n%s", diff)
			}
		})
	}
}

// TestFakeStepsNameWhatTheLastSyncSent lists a sync's steps in the order
// they went, which is how a test checks the order of the programmer.
func TestFakeStepsNameWhatTheLastSyncSent(t *testing.T) {
	s := base
	f := NewFake(TableID{nftables.TableFamilyIPv4, "sample"})
	if _, err := f.Sync(s.table("sample"), true); err != nil {
		t.Fatal(err)
	}
	s.chainB = false
	if _, err := f.Sync(s.table("sample"), false); err != nil {
		t.Fatal(err)
	}
	// The map's element leading to chain b goes before the chain.
	if got, want := strings.Join(f.Steps(), ", "), "delete dispatch, flush chain b, delete chain b"; got != want {
		t.Errorf("steps %q, want %q", got, want)
	}
}
