package node

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netplane/netplane/cni/conflist"
)

func mkNode(name string, cidrs []string, addrs ...v1.NodeAddress) *v1.Node {
	return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.NodeSpec{PodCIDRs: cidrs},
		Status: v1.NodeStatus{Addresses: addrs}}
}

func internal(ip string) v1.NodeAddress { return v1.NodeAddress{Type: v1.NodeInternalIP, Address: ip} }
func external(ip string) v1.NodeAddress { return v1.NodeAddress{Type: v1.NodeExternalIP, Address: ip} }

func TestInfoPrefersInternalIPAndTakesOnePerFamily(t *testing.T) {
	for _, tc := range []struct {
		node *v1.Node
		want string
	}{
		{mkNode("a", []string{"10.244.1.0/24"}, external("1.2.3.4"), internal("192.168.0.2"), internal("192.168.0.3")), "{a [10.244.1.0/24] [192.168.0.2]}"},
		{mkNode("b", []string{"10.244.2.0/24", "fd00:2::/64"}, external("1.2.3.4"), internal("fd01::2")), "{b [10.244.2.0/24 fd00:2::/64] [fd01::2 1.2.3.4]}"},
		{&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "legacy"}, Spec: v1.NodeSpec{PodCIDR: "10.244.3.0/24"}}, "{legacy [10.244.3.0/24] []}"},
		{mkNode("junk", []string{"nope"}, internal("nope")), "{junk [] []}"},
	} {
		if got := fmt.Sprint(infoOf(tc.node)); got != tc.want {
			t.Errorf("%s: got %s, want %s", tc.node.Name, got, tc.want)
		}
	}
}

func TestDesiredRoutesGoToEveryOtherNodeByFamily(t *testing.T) {
	nodes := []nodeInfo{
		infoOf(mkNode("self", []string{"10.244.0.0/24", "fd00::/64"}, internal("192.168.0.1"), internal("fd01::1"))),
		infoOf(mkNode("dual", []string{"10.244.1.0/24", "fd00:0:0:1::/64"}, internal("192.168.0.2"), internal("fd01::2"))),
		infoOf(mkNode("v4only", []string{"10.244.2.0/24", "fd00:0:0:2::/64"}, internal("192.168.0.3"))),
		infoOf(mkNode("nocidr", nil, internal("192.168.0.4"))),
	}
	got := fmt.Sprint(desiredRoutes("self", nodes))
	want := "[{10.244.1.0/24 192.168.0.2 dual} {10.244.2.0/24 192.168.0.3 v4only} {fd00:0:0:1::/64 fd01::2 dual}]"
	if got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}

func TestMasqueradeExemptsClusterCIDROrElseEveryNodesPodCIDRs(t *testing.T) {
	self := infoOf(mkNode("self", []string{"10.244.0.0/24"}))
	other := infoOf(mkNode("o", []string{"10.244.1.0/24"}))
	cluster := []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}
	if got := fmt.Sprint(planMasquerade(self, cluster, []nodeInfo{self, other})); got != "{[10.244.0.0/24] [10.244.0.0/16]}" {
		t.Errorf("with --cluster-cidr: %s", got)
	}
	if got := fmt.Sprint(planMasquerade(self, nil, []nodeInfo{other, self})); got != "{[10.244.0.0/24] [10.244.0.0/24 10.244.1.0/24]}" {
		t.Errorf("without --cluster-cidr: %s", got)
	}
}

// The conflist names 1.0.0 for old runtimes and lists 1.1.0 for STATUS and
// GC. Its bytes are pinned: a node agent that writes other bytes rewrites
// the file on every node when it is upgraded.
func TestConflistNamesBothVersionsAndTheNodeSettings(t *testing.T) {
	got := renderConflist(conflistOpts{PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:10:244:1::/64")},
		Bridge: "cni0", MTU: 1450, StateDir: "/var/lib/netplane/ipam"})
	const want = `{
  "cniVersion": "1.0.0",
  "cniVersions": [
    "1.0.0",
    "1.1.0"
  ],
  "name": "netplane",
  "plugins": [
    {
      "bridge": "cni0",
      "capabilities": {
        "portMappings": true
      },
      "mtu": 1450,
      "podCIDRs": [
        "10.244.1.0/24",
        "fd00:10:244:1::/64"
      ],
      "stateDir": "/var/lib/netplane/ipam",
      "type": "netplane-cni"
    }
  ]
}
`
	if string(got) != want {
		t.Fatalf("conflist:\n%s\nwant:\n%s", got, want)
	}
	// The entry is what the plugin reads.
	var l conflist.List
	if err := json.Unmarshal(got, &l); err != nil {
		t.Fatal(err)
	}
	if p := l.Plugins[0]; p.Type != conflist.Type || p.Bridge != "cni0" || p.MTU != 1450 || p.StateDir != "/var/lib/netplane/ipam" || len(p.PodCIDRs) != 2 {
		t.Fatalf("decoded entry: %+v", p)
	}
}

func TestWriteAtomicDoesNotRewriteUnchangedContent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "net.d", ConflistName)
	if wrote, err := writeAtomic(path, []byte("one"), 0o644); err != nil || !wrote {
		t.Fatalf("first write: %v %v", wrote, err)
	}
	st1, _ := os.Stat(path)
	if wrote, err := writeAtomic(path, []byte("one"), 0o644); err != nil || wrote {
		t.Fatalf("same content written again: %v %v", wrote, err)
	}
	if wrote, err := writeAtomic(path, []byte("two"), 0o644); err != nil || !wrote {
		t.Fatalf("changed content: %v %v", wrote, err)
	}
	st2, _ := os.Stat(path)
	if os.SameFile(st1, st2) {
		t.Fatal("changed content written in place instead of renamed over")
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Fatalf("directory holds %d entries, want only the conflist", len(entries))
	}
}

func TestInstallPluginCopiesExecutableOnlyWhenChanged(t *testing.T) {
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "bin", "netplane-cni")
	os.WriteFile(src, []byte("#!/bin/true\n"), 0o600)
	if wrote, err := installPlugin(src, dst); err != nil || !wrote {
		t.Fatalf("install: %v %v", wrote, err)
	}
	if st, _ := os.Stat(dst); st.Mode().Perm() != 0o755 {
		t.Fatalf("mode %v", st.Mode())
	}
	if wrote, err := installPlugin(src, dst); err != nil || wrote {
		t.Fatalf("unchanged binary copied again: %v %v", wrote, err)
	}
	if _, err := installPlugin(filepath.Join(dir, "missing"), dst); err == nil {
		t.Fatal("missing source accepted")
	}
}
