package proxy

import (
	"os"
	"strings"
	"testing"

	"github.com/google/nftables"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
)

// kernelNS is a throwaway namespace and an nftables connection into it.
func kernelNS(t *testing.T) (*netns.NS, *nftables.Conn) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs the kernel")
	}
	framework.RequireRoot(t)
	ns := netns.New(t, "render")
	f, err := os.Open(ns.Path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	conn, err := nftables.New(nftables.AsLasting(), nftables.WithNetNSFd(int(f.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.CloseLasting() })
	return ns, conn
}

func syncAll(t *testing.T, rs map[nftables.TableFamily]*Renderer, d *Desired, full bool) int {
	t.Helper()
	n := 0
	for fam, r := range rs {
		st, err := r.Sync(d.Tables[fam], full)
		if err != nil {
			t.Fatalf("sync %s: %v", familyName(fam), err)
		}
		n += st.Messages
	}
	return n
}

func renderers(conn *nftables.Conn) map[nftables.TableFamily]*Renderer {
	return map[nftables.TableFamily]*Renderer{
		nftables.TableFamilyIPv4: NewRenderer(conn, nftables.TableFamilyIPv4),
		nftables.TableFamilyIPv6: NewRenderer(conn, nftables.TableFamilyIPv6),
	}
}

func TestRendererProgramsAdoptsPatchesAndHeals(t *testing.T) {
	ns, conn := kernelNS(t)
	in := overall()
	d := Build(in)

	rs := renderers(conn)
	if n := syncAll(t, rs, d, true); n == 0 {
		t.Fatal("first sync sent nothing")
	}
	out := ns.MustExec(t, "nft", "list", "table", "ip", TableName)
	for _, want := range []string{"service-ips", "172.30.0.41 . tcp . 80 : goto service-", "dnat ip to numgen random mod 2 map", "203.0.113.0/25"} {
		if !strings.Contains(out, want) {
			t.Errorf("nft list table ip netplane lacks %q:\n%s", want, out)
		}
	}
	if n := syncAll(t, rs, d, false); n != 0 {
		t.Errorf("a sync without changes sent %d messages, want 0", n)
	}
	// A restarted proxier reads the table back and finds nothing to change.
	if n := syncAll(t, renderers(conn), d, true); n != 0 {
		t.Errorf("adopting a correct table sent %d messages, want 0", n)
	}

	// One endpoint more: only that Service's chain and one element change.
	s := in.Slices[nsName("ns1", "svc1")][0].DeepCopy()
	s.Endpoints = append(s.Endpoints, discovery.Endpoint{Addresses: []string{"10.180.2.1"}})
	in.Slices[nsName("ns1", "svc1")] = []*discovery.EndpointSlice{s}
	d2 := Build(in)
	if n := syncAll(t, rs, d2, false); n == 0 || n > 8 {
		t.Errorf("one endpoint more sent %d messages, want 1 to 8 (one chain and one element)", n)
	}
	if out := ns.MustExec(t, "nft", "list", "table", "ip", TableName); !strings.Contains(out, "10.180.2.1") {
		t.Errorf("new endpoint missing:\n%s", out)
	}

	// Deleting a Service removes its chains.
	in.Services = in.Services[1:]
	d3 := Build(in)
	syncAll(t, rs, d3, false)
	if out := ns.MustExec(t, "nft", "list", "table", "ip", TableName); strings.Contains(out, "ns1/svc1") {
		t.Errorf("deleted Service still has rules:\n%s", out)
	}
	if n := syncAll(t, renderers(conn), d3, true); n != 0 {
		t.Errorf("after deletion the kernel differs from the model by %d messages", n)
	}

	for _, vandal := range [][]string{{"flush", "table", "ip", TableName}, {"flush", "ruleset"}, {"delete", "chain", "ip", TableName, "reject-chain"}} {
		if vandal[0] == "delete" {
			ns.MustExec(t, "nft", "flush", "chain", "ip", TableName, "cluster-ips-check")
			ns.MustExec(t, "nft", "delete", "element", "ip", TableName, "no-endpoint-services", "{ 172.30.0.46 . tcp . 80 }")
		}
		ns.MustExec(t, "nft", vandal...)
		if n := syncAll(t, rs, d3, false); n != 0 {
			t.Errorf("a partial sync after nft %v sent %d messages: it must trust its memory", vandal, n)
		}
		if n := syncAll(t, rs, d3, true); n == 0 {
			t.Errorf("a full sync after nft %v repaired nothing", vandal)
		}
		if n := syncAll(t, renderers(conn), d3, true); n != 0 {
			t.Errorf("after healing nft %v the kernel still differs by %d messages", vandal, n)
		}
	}
}

func nsName(ns, name string) (k struct{ Namespace, Name string }) {
	k.Namespace, k.Name = ns, name
	return k
}

var _ = v1.ProtocolTCP
