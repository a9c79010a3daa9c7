package wireguard_test

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
	"github.com/netplane/netplane/wireguard"
)

func TestMain(m *testing.M) { framework.Main(m) }

// marker is sent by the pods in every test payload; it must never be seen
// on the underlay.
const marker = "netplane-cleartext-marker-7f3a"

// sendMarker sends the marker from ns to the echo server at addr over TCP
// (echoed back in full) and in a UDP datagram.
func sendMarker(t *testing.T, ns *netns.NS, addr string) {
	t.Helper()
	if err := ns.SendPayload(addr, []byte(strings.Repeat(marker, 20))); err != nil {
		t.Errorf("marker from %s to %s: %v", ns.Name, addr, err)
	}
}

// expectSeen checks that TCP and UDP from `from` reach the echo server on
// ip, which sees want as the source.
func expectSeen(t *testing.T, from *netns.NS, ip, want string) {
	t.Helper()
	for proto, seen := range map[string]func(string) (string, error){"TCP": from.SeenTCP, "UDP": from.SeenUDP} {
		if got, err := seen(at(ip)); err != nil || got != want {
			t.Errorf("%s from %s to %s: server saw %q (%v), want %s", proto, from.Name, ip, got, err, want)
		}
	}
}

// TestPodTrafficCrossesTheRouterOnlyEncrypted: TCP and UDP both ways
// between nodes on two subnets pass through the tunnel with the pod
// addresses intact, while a capture on both of the router's interfaces
// sees nothing but WireGuard's UDP between the two nodes and never the
// marker the pods send. Traffic to the pod CIDR of a node that has not
// published a key (the ghost) gets no answer, and no packet of it leaves
// the node: its route goes into the device, which has no peer for it.
func TestPodTrafficCrossesTheRouterOnlyEncrypted(t *testing.T) {
	l := newLab(t, 2)
	caps := []*netns.Capture{l.router.Capture(t, l.links[0]), l.router.Capture(t, l.links[1])}
	l.syncAll(t)
	a, b := l.nodes[0], l.nodes[1]
	expectSeen(t, a.ns, b.podIP(), a.podIP())
	expectSeen(t, b.ns, a.podIP(), b.podIP())
	sendMarker(t, a.ns, at(b.podIP()))
	sendMarker(t, b.ns, at(a.podIP()))
	if got, err := a.ns.Ask("tcp", at("10.244.3.1"), time.Second); err == nil {
		t.Errorf("TCP to the pod CIDR of a node without a key answered %q; want it dropped", got)
	}
	if _, err := a.ns.Ask("udp", at("10.244.3.1"), 100*time.Millisecond); err == nil {
		t.Error("UDP to the pod CIDR of a node without a key was answered; want it dropped")
	}
	nodes := map[string]bool{a.underlay.String(): true, b.underlay.String(): true}
	for _, c := range caps {
		c.Stop()
		wg := 0
		for _, f := range c.Frames() {
			p := netns.Parse(f)
			if bytes.Contains(f, []byte(marker)) {
				t.Errorf("%s: the marker crossed in clear in %s", c.Ifname, p)
			}
			switch {
			case p.EtherType == netns.EtherARP: // ARP
			case p.EtherType == netns.EtherIPv6: // IPv6 neighbour discovery of the links
			case p.Proto == netns.ProtoICMP && nodes[p.Src.String()] && nodes[p.Dst.String()]: // the lab's pings between nodes
			case p.Proto == netns.ProtoUDP && nodes[p.Src.String()] && nodes[p.Dst.String()] && (p.SrcPort == port || p.DstPort == port):
				wg++
			default:
				t.Errorf("%s: %s crossed the router; want only WireGuard between the nodes", c.Ifname, p)
			}
		}
		if wg == 0 {
			t.Errorf("%s: no WireGuard packet captured of %d frames: the capture saw nothing", c.Ifname, len(c.Frames()))
		}
	}
}

// TestAutoRunsUserspaceWithoutTheModule: auto falls back to wireguard-go
// when the kernel cannot make a wireguard link (this machine's), says so,
// and leaves no control socket in the filesystem.
func TestAutoRunsUserspaceWithoutTheModule(t *testing.T) {
	ns := netns.New(t, "wg-auto")
	var impl string
	var dev wireguard.Device
	err := ns.Do(func() (err error) {
		dev, impl, err = wireguard.Open(wireguard.Auto, wireguard.DeviceName, mtu, port, testLog(t))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	link := ns.MustExec(t, "ip", "-d", "link", "show", wireguard.DeviceName)
	want := map[string]string{wireguard.Kernel: "wireguard", wireguard.Userspace: "tun"}[impl]
	if want == "" || !strings.Contains(link, " "+want+" ") || !strings.Contains(link, "mtu 1420") {
		t.Errorf("auto opened %q; link:\n%s\nwant a %q device with mtu 1420", impl, link, want)
	}
	d, err := dev.Device()
	if err != nil || d.ListenPort != port {
		t.Errorf("device read back: port %v, %v; want %d", d, err, port)
	}
	for _, dir := range []string{"/var/run/wireguard", "/run/wireguard"} {
		if _, err := os.Stat(dir + "/" + wireguard.DeviceName + ".sock"); err == nil {
			t.Errorf("a control socket exists in %s", dir)
		}
	}
	t.Logf("auto chose %s", impl)
}
