package podnet

import (
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/cni/conflist"
	"github.com/netplane/netplane/nodeview"
)

func prefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

// The table keeps pod traffic to the cluster's pods unmasqueraded, per
// family, and masquerades the rest; its forward chain accepts pod traffic.
func TestMasqueradeTableReturnsForTheClusterAndMasqueradesTheRest(t *testing.T) {
	got := masqueradeTable(masqPlan{Sources: prefixes("10.244.1.0/24", "fd00:10:244:1::/64"), Exempt: prefixes("10.244.0.0/16", "100.64.0.0/16", "fd00:10:244::/56")}).Dump()
	const want = `add table inet netplane-pods
add chain inet netplane-pods forward { type filter hook forward priority 0 ; }
add chain inet netplane-pods postrouting { type nat hook postrouting priority 100 ; }
add rule inet netplane-pods forward meta nfproto ipv4 ip saddr 10.244.1.0/24 accept
add rule inet netplane-pods forward meta nfproto ipv4 ip daddr 10.244.1.0/24 accept
add rule inet netplane-pods forward meta nfproto ipv6 ip6 saddr fd00:10:244:1::/64 accept
add rule inet netplane-pods forward meta nfproto ipv6 ip6 daddr fd00:10:244:1::/64 accept
add rule inet netplane-pods forward meta nfproto ipv4 ip saddr 10.244.0.0/16 accept
add rule inet netplane-pods forward meta nfproto ipv4 ip daddr 10.244.0.0/16 accept
add rule inet netplane-pods forward meta nfproto ipv4 ip saddr 100.64.0.0/16 accept
add rule inet netplane-pods forward meta nfproto ipv4 ip daddr 100.64.0.0/16 accept
add rule inet netplane-pods forward meta nfproto ipv6 ip6 saddr fd00:10:244::/56 accept
add rule inet netplane-pods forward meta nfproto ipv6 ip6 daddr fd00:10:244::/56 accept
add rule inet netplane-pods postrouting meta nfproto ipv4 ip saddr 10.244.1.0/24 ip daddr { 10.244.0.0/16, 100.64.0.0/16 } return
add rule inet netplane-pods postrouting meta nfproto ipv4 ip saddr 10.244.1.0/24 masquerade
add rule inet netplane-pods postrouting meta nfproto ipv6 ip6 saddr fd00:10:244:1::/64 ip6 daddr fd00:10:244::/56 return
add rule inet netplane-pods postrouting meta nfproto ipv6 ip6 saddr fd00:10:244:1::/64 masquerade
`
	if got != want {
		t.Errorf("table:\n%s\nwant:\n%s", got, want)
	}
}

func TestAMissingBridgeNetfilterSysctlSaysToLoadTheModule(t *testing.T) {
	dir := t.TempDir()
	err := haveBridgeNetfilter(hostKernel{procSys: dir}, dir)
	if err == nil || !strings.Contains(err.Error(), "modprobe br_netfilter") {
		t.Errorf("without net/bridge: %v, want an error saying to load br_netfilter", err)
	}
	os.MkdirAll(filepath.Join(dir, "net", "bridge"), 0o755)
	for _, key := range bridgeNetfilter {
		os.WriteFile(filepath.Join(dir, key), []byte("0\n"), 0o644)
	}
	if err := haveBridgeNetfilter(hostKernel{procSys: dir}, dir); err != nil {
		t.Errorf("with both sysctls: %v", err)
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

func TestOnlyChangesOfThisNodeOrOfExemptPodCIDRsAreRelevant(t *testing.T) {
	me := &nodeview.Node{Name: "node1", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}}
	other := &nodeview.Node{Name: "node2", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.2.0/24")}}
	moved := &nodeview.Node{Name: "node2", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.20.0/24")}}
	readdressed := &nodeview.Node{Name: "node2", PodCIDRs: other.PodCIDRs, IPs: []netip.Addr{netip.MustParseAddr("192.168.10.2")}}
	for _, tc := range []struct {
		name      string
		fromNodes bool // no --cluster-cidr
		old, cur  *nodeview.Node
		want      bool
	}{
		{"this node's Node appears", false, nil, me, true},
		{"this node's Node changes", false, me, me, true},
		{"another Node appears, with --cluster-cidr", false, nil, other, false},
		{"another Node is deleted, with --cluster-cidr", false, other, nil, false},
		{"another Node appears, without --cluster-cidr", true, nil, other, true},
		{"another Node's pod CIDR changes, without --cluster-cidr", true, other, moved, true},
		{"another Node's address changes, without --cluster-cidr", true, other, readdressed, false},
	} {
		var s nodeview.Settings
		if !tc.fromNodes {
			s = nodeview.SettingsOf(v1alpha1.Node{ClusterCIDRs: prefixes("10.244.0.0/16")})
		}
		if got := relevant("node1", s, tc.old, tc.cur); got != tc.want {
			t.Errorf("%s: relevant %v, want %v", tc.name, got, tc.want)
		}
	}
}
