package wireguard

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// key is a fixed test key per seed, private and public.
func key(seed byte) (priv, pub wgtypes.Key) {
	var k wgtypes.Key
	for i := range k {
		k[i] = seed
	}
	// Clamp as wgtypes.GeneratePrivateKey does.
	k[0] &= 248
	k[31] = (k[31] & 127) | 64
	return k, k.PublicKey()
}

// This node's underlay address in each family.
var v4, v6 = netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1")

// netOpts compares the netip types, whose fields are unexported.
var netOpts = cmp.Options{
	cmp.Comparer(func(a, b netip.Prefix) bool { return a == b }),
	cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b }),
}

func pub(seed byte) wgtypes.Key { _, p := key(seed); return p }

func node(name, ip string, key wgtypes.Key, cidrs ...string) Node {
	n := Node{Name: name}
	if ip != "" {
		n.IPs = []netip.Addr{netip.MustParseAddr(ip)}
	}
	if key != (wgtypes.Key{}) {
		n.Key = key.String()
	}
	for _, c := range cidrs {
		n.PodCIDRs = append(n.PodCIDRs, netip.MustParsePrefix(c))
	}
	return n
}

func prefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func peer(name, ep string, k wgtypes.Key, cidrs ...string) Peer {
	return Peer{Node: name, PublicKey: k, Endpoint: netip.MustParseAddrPort(ep), AllowedIPs: prefixes(cidrs...)}
}

func TestDesiredPeersAndDrops(t *testing.T) {
	self := node("self", "10.0.0.1", pub(1), "10.244.0.0/24")
	withKey := func(n Node, k string) Node { n.Key = k; return n }
	dual := node("b", "10.0.1.2", pub(3), "10.244.2.0/24", "fd00:244:2::/64")
	dual.IPs = append(dual.IPs, netip.MustParseAddr("fd00::2"))
	cases := []struct {
		name     string
		underlay netip.Addr
		nodes    []Node
		peers    []Peer
		rejected map[string]Reason
		drop     []netip.Prefix
	}{
		{"alone", v4, []Node{self}, nil, nil, nil},
		{"one peer on another subnet", v4,
			[]Node{self, node("a", "10.1.0.2", pub(2), "10.244.1.0/24")},
			[]Peer{peer("a", "10.1.0.2:51820", pub(2), "10.244.1.0/24")}, nil, nil},
		{"both families of pod CIDRs through an IPv4 endpoint", v4, []Node{self, dual},
			[]Peer{peer("b", "10.0.1.2:51820", pub(3), "10.244.2.0/24", "fd00:244:2::/64")}, nil, nil},
		{"IPv6 underlay uses the IPv6 InternalIP", v6, []Node{self, dual},
			[]Peer{peer("b", "[fd00::2]:51820", pub(3), "10.244.2.0/24", "fd00:244:2::/64")}, nil, nil},
		{"no InternalIP of this family", v6,
			[]Node{self, node("a", "10.1.0.2", pub(2), "10.244.1.0/24")},
			nil, map[string]Reason{"a": NoAddress}, prefixes("10.244.1.0/24")},
		{"no key yet: dropped, not a peer", v4,
			[]Node{self, node("a", "10.1.0.2", wgtypes.Key{}, "10.244.1.0/24"), node("b", "10.1.0.3", pub(3), "10.244.2.0/24")},
			[]Peer{peer("b", "10.1.0.3:51820", pub(3), "10.244.2.0/24")}, map[string]Reason{"a": NoKey}, prefixes("10.244.1.0/24")},
		{"malformed key", v4,
			[]Node{self, withKey(node("a", "10.1.0.2", wgtypes.Key{}, "10.244.1.0/24"), "not-a-key")},
			nil, map[string]Reason{"a": BadKey}, prefixes("10.244.1.0/24")},
		{"key of 31 bytes", v4,
			[]Node{self, withKey(node("a", "10.1.0.2", wgtypes.Key{}, "10.244.1.0/24"), pub(2).String()[:40]+"AA=")},
			nil, map[string]Reason{"a": BadKey}, prefixes("10.244.1.0/24")},
		{"all-zero key", v4,
			[]Node{self, withKey(node("a", "10.1.0.2", wgtypes.Key{}, "10.244.1.0/24"), wgtypes.Key{}.String())},
			nil, map[string]Reason{"a": BadKey}, prefixes("10.244.1.0/24")},
		{"no pod CIDRs: nothing to route or drop", v4,
			[]Node{self, node("a", "10.1.0.2", wgtypes.Key{})}, nil, nil, nil},
		{"two nodes with one key are both rejected", v4,
			[]Node{self, node("a", "10.1.0.2", pub(2), "10.244.1.0/24"), node("b", "10.1.0.3", pub(2), "10.244.2.0/24")},
			nil, map[string]Reason{"a": Conflict, "b": Conflict}, prefixes("10.244.1.0/24", "10.244.2.0/24")},
		{"a node with this node's key", v4,
			[]Node{self, node("a", "10.1.0.2", pub(1), "10.244.1.0/24")},
			nil, map[string]Reason{"a": Conflict}, prefixes("10.244.1.0/24")},
		{"overlapping pod CIDRs reject both nodes", v4,
			[]Node{self, node("a", "10.1.0.2", pub(2), "10.244.8.0/22"), node("b", "10.1.0.3", pub(3), "10.244.9.0/24"), node("c", "10.1.0.4", pub(4), "10.244.12.0/24")},
			[]Peer{peer("c", "10.1.0.4:51820", pub(4), "10.244.12.0/24")}, map[string]Reason{"a": Conflict, "b": Conflict}, prefixes("10.244.8.0/22", "10.244.9.0/24")},
		{"a pod CIDR overlapping this node's is rejected but not dropped", v4,
			[]Node{self, node("a", "10.1.0.2", pub(2), "10.244.0.128/25", "10.244.5.0/24")},
			nil, map[string]Reason{"a": Conflict}, prefixes("10.244.5.0/24")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, selfPub := key(1)
			p := Desired(Input{Self: "self", PublicKey: selfPub, Underlay: c.underlay, Port: DefaultPort, Nodes: c.nodes})
			if diff := cmp.Diff(c.peers, p.Peers, netOpts); diff != "" {
				t.Errorf("peers (-want +got):\n%s", diff)
			}
			got := map[string]Reason{}
			for _, r := range p.Rejected {
				got[r.Node] = r.Reason
				if !strings.Contains(r.Detail, r.Node) {
					t.Errorf("rejection of %s does not name it: %s", r.Node, r.Detail)
				}
			}
			if len(got) == 0 {
				got = nil
			}
			if diff := cmp.Diff(c.rejected, got); diff != "" {
				t.Errorf("rejected (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(c.drop, p.Drop, netOpts); diff != "" {
				t.Errorf("drop (-want +got):\n%s", diff)
			}
		})
	}
}

func TestRejectionDetailNeverEchoesAMalformedKey(t *testing.T) {
	secret := "c2VjcmV0LXByaXZhdGUta2V5LXdyaXR0ZW4tYnktbWlzdGFrZQ=="
	p := Desired(Input{Self: "self", Underlay: v4, Port: DefaultPort, Nodes: []Node{
		{Name: "a", IPs: []netip.Addr{netip.MustParseAddr("10.0.0.2")}, PodCIDRs: prefixes("10.244.1.0/24"), Key: secret}}})
	if len(p.Rejected) != 1 || strings.Contains(p.Rejected[0].Detail, secret) {
		t.Fatalf("rejection %+v: want one, not quoting the annotation", p.Rejected)
	}
}

func TestNewlyRejectedWarnsOncePerNodeAndReason(t *testing.T) {
	prev := []Rejected{{Node: "a", Reason: NoKey}, {Node: "b", Reason: NoKey}}
	cur := []Rejected{{Node: "a", Reason: NoKey}, {Node: "b", Reason: BadKey}, {Node: "c", Reason: NoKey}}
	got := NewlyRejected(prev, cur)
	want := []Rejected{{Node: "b", Reason: BadKey}, {Node: "c", Reason: NoKey}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}
