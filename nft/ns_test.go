package nft

import (
	"net/netip"
	"testing"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
)

// testName is the name of the tables the tests program.
const testName = "netplane"

// kernelNS is a throwaway namespace and a way to connect to its nftables.
func kernelNS(t *testing.T) (*netns.NS, Dialer) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs the kernel")
	}
	framework.RequireRoot(t)
	ns := netns.New(t, "nft")
	d, closeNS, err := NamespaceDialer(ns.Path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = closeNS() })
	return ns, d
}

func netipAddr(s string) netip.Addr { return netip.MustParseAddr(s) }
