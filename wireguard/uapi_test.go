package wireguard

import (
	"encoding/hex"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/tun/tuntest"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// silentBind is a conn.Bind that sends nothing and receives nothing, so
// that wireguard-go runs without a socket or a namespace.
type silentBind struct {
	mu     sync.Mutex
	closed chan struct{}
}

func (b *silentBind) Open(port uint16) ([]conn.ReceiveFunc, uint16, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	closed := make(chan struct{})
	b.closed = closed
	recv := func([][]byte, []int, []conn.Endpoint) (int, error) { <-closed; return 0, net.ErrClosed }
	return []conn.ReceiveFunc{recv}, port, nil
}

func (b *silentBind) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed != nil {
		close(b.closed)
		b.closed = nil
	}
	return nil
}

func (b *silentBind) SetMark(uint32) error               { return nil }
func (b *silentBind) Send([][]byte, conn.Endpoint) error { return nil }
func (b *silentBind) BatchSize() int                     { return 1 }
func (b *silentBind) ParseEndpoint(s string) (conn.Endpoint, error) {
	return conn.NewStdNetBind().ParseEndpoint(s)
}

// silentUserspace is wireguard-go itself behind the Device seam, on a
// channel TUN with a silent bind: the configuration protocol as the
// userspace device speaks it, without root.
func silentUserspace(t testing.TB) *UserspaceDevice {
	u, err := newUserspace(DeviceName, tuntest.NewChannelTUN().TUN(), &silentBind{}, DefaultPort, logr.Discard())
	if err == nil {
		err = u.up()
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { u.Close() })
	return u
}

func TestUserspaceDeviceTakesThePlanAndReadsItBack(t *testing.T) {
	u := silentUserspace(t)
	priv, _ := key(1)
	plan := Plan{Peers: []Peer{
		peer("a", "10.0.0.2:51820", pub(2), "10.244.1.0/24", "fd00:244:1::/64"),
		peer("b", "[fd00::3]:51820", pub(3), "10.244.2.0/24"),
	}}
	steps := []Plan{plan, {Peers: []Peer{plan.Peers[0], peer("b", "10.0.9.3:51820", pub(4), "10.244.2.0/24", "10.244.3.0/24")}}, {}}
	for i, want := range steps {
		d, err := u.Device()
		if err != nil {
			t.Fatal(err)
		}
		if err := u.Configure(Heal(d, priv, DefaultPort, want)); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		d, err = u.Device()
		if err != nil {
			t.Fatal(err)
		}
		if d.PrivateKey != priv || d.PublicKey != priv.PublicKey() || d.ListenPort != DefaultPort {
			t.Errorf("step %d: key or port not as set: port %d", i, d.ListenPort)
		}
		got := named(PeersOf(d), want.Peers)
		if len(got) == 0 {
			got = nil
		}
		slices.SortFunc(got, func(a, b Peer) int { return strings.Compare(a.Node, b.Node) })
		if diff := cmp.Diff(want.Peers, got, netOpts); diff != "" {
			t.Errorf("step %d: peers read back (-want +got):\n%s", i, diff)
		}
	}
}

func TestUAPIEncodesEveryField(t *testing.T) {
	priv, _ := key(1)
	port, mark := 51820, 7
	cfg := wgtypes.Config{PrivateKey: &priv, ListenPort: &port, FirewallMark: &mark, ReplacePeers: true, Peers: []wgtypes.PeerConfig{
		{PublicKey: pub(2), Remove: true},
		{PublicKey: pub(3), UpdateOnly: true, Endpoint: udpAddr(mustAddrPort("[fd00::3]:51820")), ReplaceAllowedIPs: true,
			AllowedIPs: ipNets(prefixes("10.244.2.0/24", "fd00:244:2::/64"))},
	}}
	want := "private_key=" + hexOf(priv) + "\nlisten_port=51820\nfwmark=7\nreplace_peers=true\n" +
		"public_key=" + hexOf(pub(2)) + "\nremove=true\n" +
		"public_key=" + hexOf(pub(3)) + "\nupdate_only=true\nendpoint=[fd00::3]:51820\nreplace_allowed_ips=true\n" +
		"allowed_ip=10.244.2.0/24\nallowed_ip=fd00:244:2::/64\n"
	if got := encodeUAPI(cfg); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

func TestUAPIDecodeRejectsGarbage(t *testing.T) {
	for _, text := range []string{"public_key=zz\n", "listen_port=x\n", "endpoint=1.2.3.4:5\n", "errno=1\n"} {
		if _, err := decodeUAPI(DeviceName, text); err == nil {
			t.Errorf("%q decoded without error", text)
		}
	}
}

func mustAddrPort(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func hexOf(k wgtypes.Key) string { return hex.EncodeToString(k[:]) }
