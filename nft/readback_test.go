package nft

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// TestDumpsReadSetsAndChainsBackAndReportKernelErrors reads back what nft
// wrote, including a set big enough to take many dump messages, and gets
// the kernel's error for a set that does not exist.
func TestDumpsReadSetsAndChainsBackAndReportKernelErrors(t *testing.T) {
	ns, dial := kernelNS(t)
	var elems []string
	for i := range 3000 {
		elems = append(elems, fmt.Sprintf("10.%d.%d.%d . 10.0.0.1", i/65536, i/256%256, i%256))
	}
	ns.MustExec(t, "nft", "add table ip "+testName+
		"; add set ip "+testName+" big { type ipv4_addr . ipv4_addr ; }"+
		"; add element ip "+testName+" big { "+strings.Join(elems, ", ")+" }"+
		"; add map ip "+testName+" verdicts { type ipv4_addr : verdict ; }"+
		"; add chain ip "+testName+" target"+
		"; add element ip "+testName+" verdicts { 10.0.0.1 : goto target, 10.0.0.2 : drop }"+
		"; add rule ip "+testName+" target counter comment \"netplane:first\""+
		"; add rule ip "+testName+" target accept")
	dump, err := dial.dumper(TableID{nftables.TableFamilyIPv4, testName})
	if err != nil {
		t.Fatal(err)
	}
	defer dump.close()
	got, err := dump.setElementIDs([]string{"big", "verdicts"})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(got["big"]); n != len(elems) {
		t.Errorf("read %d elements of set big, want %d", n, len(elems))
	}
	want := map[string]bool{
		(Element{Key: []byte{10, 0, 0, 1}, Verdict: &expr.Verdict{Kind: expr.VerdictGoto, Chain: "target"}}).ID(): true,
		(Element{Key: []byte{10, 0, 0, 2}, Verdict: &expr.Verdict{Kind: expr.VerdictDrop}}).ID():                  true,
	}
	if len(got["verdicts"]) != len(want) {
		t.Errorf("verdicts read back as %q", keysOf(got["verdicts"]))
	}
	for id := range got["verdicts"] {
		if !want[id] {
			t.Errorf("verdicts element %q is not one written", id)
		}
	}
	fps, err := dump.ruleFingerprints([]string{"target"})
	if err != nil || strings.Join(fps["target"], ",") != "netplane:first," {
		t.Errorf("rule fingerprints %q, %v; want the first rule's comment and none for the second", fps["target"], err)
	}
	if _, err := dump.setElementIDs([]string{"missing"}); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("reading a missing set: %v, want ENOENT", err)
	}
}

func keysOf(m map[string]uint32) (out []string) {
	for k := range m {
		out = append(out, k)
	}
	return out
}
