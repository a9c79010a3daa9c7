package wireguard

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// describe is a peer configuration as one line per peer, keys by seed
// (k2 is pub(2)), for readable failures.
func describe(pcs []wgtypes.PeerConfig) []string {
	var out []string
	for _, pc := range pcs {
		name := pc.PublicKey.String()[:6]
		for s := byte(1); s < 20; s++ {
			if pub(s) == pc.PublicKey {
				name = fmt.Sprintf("k%d", s)
			}
		}
		var b strings.Builder
		switch {
		case pc.Remove:
			b.WriteString("remove " + name)
		case pc.UpdateOnly && pc.PersistentKeepaliveInterval != nil:
			b.WriteString(fmt.Sprintf("keepalive %v %s", *pc.PersistentKeepaliveInterval, name))
		case pc.UpdateOnly:
			b.WriteString("update " + name)
		default:
			b.WriteString("add " + name)
		}
		if pc.Endpoint != nil {
			b.WriteString(" endpoint=" + pc.Endpoint.String())
		}
		if pc.ReplaceAllowedIPs {
			var ips []string
			for _, n := range pc.AllowedIPs {
				ips = append(ips, n.String())
			}
			b.WriteString(" allowed=" + strings.Join(ips, ","))
		}
		out = append(out, b.String())
	}
	return out
}

func TestDiffIsIncremental(t *testing.T) {
	a := peer("a", "10.0.0.2:51820", pub(2), "10.244.1.0/24")
	b := peer("b", "10.0.0.3:51820", pub(3), "10.244.2.0/24")
	bMoved := peer("b", "10.0.9.3:51820", pub(3), "10.244.2.0/24")
	bGrown := peer("b", "10.0.0.3:51820", pub(3), "10.244.2.0/24", "fd00:244:2::/64")
	bRekeyed := peer("b", "10.0.0.3:51820", pub(4), "10.244.2.0/24")
	cases := []struct {
		name             string
		current, desired []Peer
		want             []string
	}{
		{"nothing to do", []Peer{a, b}, []Peer{a, b}, nil},
		{"new node", []Peer{a}, []Peer{a, b}, []string{"add k3 endpoint=10.0.0.3:51820 allowed=10.244.2.0/24"}},
		{"deleted node", []Peer{a, b}, []Peer{a}, []string{"remove k3"}},
		{"re-addressed node: endpoint only", []Peer{a, b}, []Peer{a, bMoved}, []string{"update k3 endpoint=10.0.9.3:51820"}},
		{"new pod CIDR: allowed IPs only", []Peer{a, b}, []Peer{a, bGrown}, []string{"update k3 allowed=10.244.2.0/24,fd00:244:2::/64"}},
		{"re-keyed node: old removed before new added", []Peer{a, b}, []Peer{a, bRekeyed},
			[]string{"remove k3", "add k4 endpoint=10.0.0.3:51820 allowed=10.244.2.0/24"}},
		{"empty device", nil, []Peer{a, b}, []string{"add k2 endpoint=10.0.0.2:51820 allowed=10.244.1.0/24",
			"add k3 endpoint=10.0.0.3:51820 allowed=10.244.2.0/24"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if diff := cmp.Diff(c.want, describe(Diff(c.current, c.desired))); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestHandshakeTurnsKeepaliveOnThenOff(t *testing.T) {
	got := describe(Handshake([]Peer{peer("a", "10.0.0.2:51820", pub(2)), peer("b", "10.0.0.3:51820", pub(3))}))
	want := []string{"keepalive 25s k2", "keepalive 25s k3", "keepalive 0s k2", "keepalive 0s k3"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestHealRestoresKeyPortAndPeersOfADevice(t *testing.T) {
	priv, _ := key(1)
	other, _ := key(9)
	plan := Plan{Peers: []Peer{peer("a", "10.0.0.2:51820", pub(2), "10.244.1.0/24")}}
	dev := NewFake(DeviceName)
	port := 4000
	// Someone set another key and port, and added a stray peer.
	if err := dev.Configure(wgtypes.Config{PrivateKey: &other, ListenPort: &port, Peers: []wgtypes.PeerConfig{
		{PublicKey: pub(7), AllowedIPs: ipNets(prefixes("192.168.0.0/16"))}}}); err != nil {
		t.Fatal(err)
	}
	d, _ := dev.Device()
	cfg := Heal(d, priv, DefaultPort, plan)
	if err := dev.Configure(cfg); err != nil {
		t.Fatal(err)
	}
	d, _ = dev.Device()
	if d.PrivateKey != priv || d.ListenPort != DefaultPort {
		t.Errorf("after heal: key %v port %d, want ours and %d", d.PrivateKey == priv, d.ListenPort, DefaultPort)
	}
	if diff := cmp.Diff(plan.Peers, named(PeersOf(d), plan.Peers), netOpts); diff != "" {
		t.Errorf("peers after heal (-want +got):\n%s", diff)
	}
	if again := Heal(d, priv, DefaultPort, plan); !Empty(again) {
		t.Errorf("a healed device still differs: %+v", again)
	}
}

// named gives read-back peers the node names of the plan's, by key.
func named(got, plan []Peer) []Peer {
	for i := range got {
		for _, p := range plan {
			if p.PublicKey == got[i].PublicKey {
				got[i].Node = p.Node
			}
		}
	}
	return got
}

func TestStatsCountPeersByHandshake(t *testing.T) {
	now := time.Date(2026, 11, 28, 4, 0, 0, 0, time.UTC)
	dev := &wgtypes.Device{Peers: []wgtypes.Peer{
		{LastHandshakeTime: now.Add(-time.Minute), TransmitBytes: 10, ReceiveBytes: 20},
		{LastHandshakeTime: now.Add(-4 * time.Minute), TransmitBytes: 1},
		{},
	}}
	got := StatsOf(dev, Plan{Rejected: []Rejected{{Node: "x", Reason: NoKey}}}, now)
	want := Stats{Up: 1, Stale: 2, NoKey: 1, TxBytes: 11, RxBytes: 20}
	if got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
}

func TestPeersOfUnmapsAddresses(t *testing.T) {
	dev := &wgtypes.Device{Peers: []wgtypes.Peer{{PublicKey: pub(2),
		Endpoint:   udpAddr(netip.MustParseAddrPort("[::ffff:10.0.0.2]:51820")),
		AllowedIPs: ipNets(prefixes("10.244.1.0/24"))}}}
	want := []Peer{peer("", "10.0.0.2:51820", pub(2), "10.244.1.0/24")}
	if diff := cmp.Diff(want, PeersOf(dev), netOpts); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}
