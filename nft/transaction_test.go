package nft

import (
	"strings"
	"testing"

	"github.com/google/nftables"
)

// TestQueuedTransactionsStopAtTheFirstFailure: transactions are sent by a
// goroutine while the next is encoded; a failure is reported by Wait (or
// the next Queue), and nothing queued after it reaches the kernel.
func TestQueuedTransactionsStopAtTheFirstFailure(t *testing.T) {
	ns, dial := kernelNS(t)
	w, err := newBatchWriter(dial)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	table := func(name string) *nftables.Table {
		return &nftables.Table{Name: name, Family: nftables.TableFamilyIPv4}
	}

	w.library().AddTable(table("first"))
	if err := w.Queue(); err != nil {
		t.Fatal(err)
	}
	w.library().AddChain(&nftables.Chain{Name: "c", Table: table("missing")}) // fails: no such table
	failed := w.Queue() != nil                                                // reported now if the first was still in flight
	w.library().AddTable(table("after"))
	failed = w.Queue() != nil || failed
	failed = w.Wait() != nil || failed
	if !failed {
		t.Fatal("a failed transaction was not reported")
	}
	out := ns.MustExec(t, "nft", "list", "tables")
	if !strings.Contains(out, "first") || strings.Contains(out, "after") {
		t.Errorf("tables after a failure in the middle: %q; want first and not after", out)
	}
	if w.commits != 1 {
		t.Errorf("%d transactions counted as committed, want 1", w.commits)
	}
	// The writer is usable again after Wait.
	w.library().AddTable(table("again"))
	if err := w.Flush(); err != nil {
		t.Fatalf("after the failure was reported: %v", err)
	}
	if out := ns.MustExec(t, "nft", "list", "tables"); !strings.Contains(out, "again") {
		t.Errorf("tables: %q; want again", out)
	}
}
