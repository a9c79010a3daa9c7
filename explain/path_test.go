package explain

import (
	"net/netip"
	"strings"
	"testing"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/nodeview"
	"github.com/netplane/netplane/wireguard"
)

func TestPathWithEncryption(t *testing.T) {
	key := func() string {
		k, err := wgtypes.GeneratePrivateKey()
		if err != nil {
			t.Fatal(err)
		}
		return k.PublicKey().String()
	}
	node := func(name, ip, cidr, key string) nodeview.Node {
		n := nodeview.Node{Name: name, IPs: []netip.Addr{netip.MustParseAddr(ip)}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix(cidr)}}
		if key != "" {
			n.Annotations = map[string]string{wireguard.Annotation: key}
		}
		return n
	}
	nodes := []nodeview.Node{
		node("n1", "192.168.1.11", "10.244.1.0/24", key()),
		node("n2", "192.168.2.12", "10.244.2.0/24", key()),
		node("n3", "192.168.1.13", "10.244.3.0/24", ""),          // no key yet
		node("n4", "192.168.1.14", "10.244.4.0/24", "not-a-key"), // malformed
	}
	wg := func(permissive bool) Overlay {
		enc := v1alpha1.Encryption{Mode: v1alpha1.EncryptionWireGuard, Permissive: permissive, WireGuardPort: wireguard.DefaultPort}
		return Overlay{Settings: nodeview.SettingsOf(v1alpha1.Node{Overlay: v1alpha1.Overlay{Mode: "never"}, Encryption: enc})}
	}
	for _, c := range []struct {
		name     string
		dst      string
		ov       Overlay
		kind     string
		contains string
	}{
		{"a keyed peer: through the tunnel", "n2", wg(false), PathWireGuard, "WireGuard to node n2 (192.168.2.12:51820 on netplane.wg)"},
		{"a node without a key: dropped", "n3", wg(false), PathNone, "dropped: node n3 has not published its WireGuard public key"},
		{"a malformed key: dropped", "n4", wg(false), PathNone, "dropped: annotation " + wireguard.Annotation + " of node n4"},
		{"permissive: without a key, the overlay in clear", "n3", wg(true), PathDirect, "in clear (permissive encryption; node n3 has not published"},
		{"permissive: a keyed peer still through the tunnel", "n2", wg(true), PathWireGuard, "WireGuard to node n2"},
		{"no encryption: the overlay", "n2", Overlay{Settings: nodeview.Settings{Overlay: "never"}}, PathDirect, "direct route to node n2"},
		{"the same node: the bridge", "n1", wg(false), PathSameNode, "same node n1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			kind, text := path("n1", c.dst, nodes, nodeview.IPv4, c.ov)
			if kind != c.kind || !strings.Contains(text, c.contains) {
				t.Errorf("path = %s %q, want %s containing %q", kind, text, c.kind, c.contains)
			}
		})
	}
}
