package nft

import (
	"errors"
	"io/fs"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
)

// TestReplaceSwapsTheWholeTableInOneTransaction: Replace makes the table
// exactly the one given (what others added goes), refuses a bad table
// without touching the old one, and Delete removes it, there or not.
func TestReplaceSwapsTheWholeTableInOneTransaction(t *testing.T) {
	ns, dial := kernelNS(t)
	list := func() string {
		return ns.MustExec(t, "sh", "-c", "nft list table ip pods 2>&1 || true")
	}
	// adopted checks that the kernel's table is want: a programmer finds
	// nothing to send.
	adopted := func(want *Table) {
		t.Helper()
		p := NewProgrammer(dial, want.ID())
		defer p.Close()
		if st, err := p.Sync(want, true); err != nil || st.Messages != 0 {
			t.Errorf("the replaced table differs from the one given: a sync sent %d messages (%v)\n%s", st.Messages, err, list())
		}
	}
	s := base
	first := s.table("pods")
	if err := Replace(dial, first); err != nil {
		t.Fatal(err)
	}
	adopted(first)
	ns.MustExec(t, "nft", "add chain ip pods stray; add element ip pods addrs { 10.200.0.1 }")
	s.addrs, s.chainB = 7, false
	second := s.table("pods")
	if err := Replace(dial, second); err != nil {
		t.Fatal(err)
	}
	adopted(second)
	if out := list(); strings.Contains(out, "stray") || strings.Contains(out, "10.200.0.1") {
		t.Errorf("what others added survived the replacement:\n%s", out)
	}

	// However many messages: a programmer would split this many.
	defer func(n int) { maxMessages = n }(maxMessages)
	maxMessages = 5
	bad := s.table("pods")
	bad.AddRule("a", NewRule(bad.Family).Jump("missing").Rule())
	if err := Replace(dial, bad); !errors.Is(err, unix.ENOENT) {
		t.Errorf("replacing with a rule jumping nowhere: %v; want ENOENT", err)
	}
	adopted(second)

	id := TableID{nftables.TableFamilyIPv4, "pods"}
	for range 2 { // the second time there is no table
		if err := Delete(dial, id); err != nil {
			t.Fatal(err)
		}
	}
	if out := list(); !strings.Contains(out, "No such file") {
		t.Errorf("the table is still there:\n%s", out)
	}
}

// TestRuleFingerprintsFindTheRulesOfATableAndNameWhatIsMissing: what a
// check compares desired rules with, and its answer for a table or chain
// that is not there.
func TestRuleFingerprintsFindTheRulesOfATableAndNameWhatIsMissing(t *testing.T) {
	ns, dial := kernelNS(t)
	want := NewTable(nftables.TableFamilyINet, "checked")
	want.Chain("a", nil)
	rules := []Rule{NewRule(want.Family).NFProto(false).MatchPrefix(Saddr, netip.MustParsePrefix("10.0.0.0/8"), false).Accept().Rule(),
		NewRule(want.Family).Return().Rule()}
	for _, r := range rules {
		want.AddRule("a", r)
	}
	if _, err := RuleFingerprints(dial, want.ID(), "a"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("fingerprints of a table not there: %v, want an error of fs.ErrNotExist", err)
	}
	if err := Replace(dial, want); err != nil {
		t.Fatal(err)
	}
	got, err := RuleFingerprints(dial, want.ID(), "a")
	if err != nil {
		t.Fatal(err)
	}
	if fps := got["a"]; len(fps) != 2 || fps[0] != rules[0].FP || fps[1] != rules[1].FP {
		t.Errorf("fingerprints of chain a: %q, want %q and %q", fps, rules[0].FP, rules[1].FP)
	}
	ns.MustExec(t, "nft", "flush chain inet checked a")
	if got, err := RuleFingerprints(dial, want.ID(), "a"); err != nil || len(got["a"]) != 0 {
		t.Errorf("fingerprints of a flushed chain: %q, %v; want none", got["a"], err)
	}
	if _, err := RuleFingerprints(dial, want.ID(), "b"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("fingerprints of a chain not there: %v, want an error of fs.ErrNotExist", err)
	}
}
