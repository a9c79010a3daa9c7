package nodeview

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/netplane/netplane/apis/config/v1alpha1"
)

func TestClusterCIDRsAreTheFlagsElseEveryNodesPodCIDRs(t *testing.T) {
	p := netip.MustParsePrefix
	nodes := []Node{
		{Name: "b", PodCIDRs: []netip.Prefix{p("10.244.1.0/24"), p("fd00:10:244:1::/64")}},
		{Name: "a", PodCIDRs: []netip.Prefix{p("10.244.0.0/24")}},
		{Name: "new"}, // no pod CIDRs assigned yet
	}
	for _, tc := range []struct {
		name      string
		flag      []netip.Prefix
		nodes     []Node
		want      string
		fromNodes bool
	}{
		{"--cluster-cidr, whatever the Nodes", []netip.Prefix{p("fd00:10:244::/56"), p("10.244.0.0/16")}, nodes, "[10.244.0.0/16 fd00:10:244::/56]", false},
		{"unset: every Node's pod CIDRs, sorted", nil, nodes, "[10.244.0.0/24 10.244.1.0/24 fd00:10:244:1::/64]", true},
		{"unset, no Node with pod CIDRs: none", nil, []Node{{Name: "new"}}, "[]", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := SettingsOf(v1alpha1.Node{ClusterCIDRs: tc.flag})
			if got := fmt.Sprint(s.ClusterCIDRs(tc.nodes)); got != tc.want || s.ClusterCIDRsFromNodes() != tc.fromNodes {
				t.Errorf("ClusterCIDRs = %s (from Nodes: %v), want %s (%v)", got, s.ClusterCIDRsFromNodes(), tc.want, tc.fromNodes)
			}
		})
	}
}

func TestSettingsOfTheDataplane(t *testing.T) {
	wg := func(permissive bool) v1alpha1.Encryption {
		return v1alpha1.Encryption{Mode: v1alpha1.EncryptionWireGuard, Permissive: permissive}
	}
	for _, tc := range []struct {
		mode           string
		enc            v1alpha1.Encryption
		want           string
		off, tunnelled bool
	}{
		{"", v1alpha1.Encryption{Mode: v1alpha1.EncryptionNone}, "VXLAN (cross-subnet)", false, true},
		{v1alpha1.OverlayAlways, v1alpha1.Encryption{Mode: v1alpha1.EncryptionNone}, "VXLAN (always)", false, true},
		{v1alpha1.OverlayNever, v1alpha1.Encryption{Mode: v1alpha1.EncryptionNone}, "direct", false, false},
		{v1alpha1.OverlayCrossSubnet, wg(false), "WireGuard (strict)", true, false},
		{v1alpha1.OverlayCrossSubnet, wg(true), "WireGuard (permissive) over VXLAN (cross-subnet)", false, true},
		{v1alpha1.OverlayNever, wg(true), "WireGuard (permissive) over direct", false, false},
	} {
		s := SettingsOf(v1alpha1.Node{Overlay: v1alpha1.Overlay{Mode: tc.mode}, Encryption: tc.enc})
		if s.Dataplane() != tc.want || s.OverlayOff() != tc.off || s.Tunnelled() != tc.tunnelled {
			t.Errorf("%q %+v: %q, overlay off %v, tunnelled %v; want %q, %v, %v", tc.mode, tc.enc, s.Dataplane(), s.OverlayOff(), s.Tunnelled(), tc.want, tc.off, tc.tunnelled)
		}
	}
}
