package overlay_test

import (
	"io"
	"net"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/nodeview"
	"github.com/netplane/netplane/overlay"
)

// BenchmarkPodToPod measures traffic between a pod on node1 and one on
// node2 (same subnet) over a direct route (mode never) and through the
// tunnel (mode always), each path with the pod MTU it would have: one TCP
// stream's throughput, and the rate of 64-byte requests and responses on
// one connection. The paths take turns for three rounds, so that load
// from other processes on the machine falls on both alike; the ratios of
// the best round of each to the direct path are logged at the end (-v).
func BenchmarkPodToPod(b *testing.B) {
	l := newLab(b)
	sink, err := l.node(2).pod.Listen(":9000")
	if err != nil {
		b.Fatal(err)
	}
	framework.Serve(b, sink, answerBench)
	results := map[string]float64{}
	for range 3 {
		for _, path := range []string{"direct", "vxlan"} {
			for k, v := range benchPath(b, l, path) {
				results[k] = max(results[k], v)
			}
		}
	}
	for _, kind := range []string{"stream", "rr"} {
		if d := results["direct/"+kind]; d > 0 {
			b.Logf("%s: direct %.0f/s, vxlan %.0f/s, vxlan/direct %.2f", kind, d, results["vxlan/"+kind], results["vxlan/"+kind]/d)
		}
	}
}

// ipv4PodMTU is the MTU the node role gives pods over an IPv4 underlay
// of 1500 bytes with the overlay in mode.
func ipv4PodMTU(mode overlay.Mode) int {
	self := nodeview.Node{IPs: []netip.Addr{netip.MustParseAddr("192.168.0.1")}}
	return nodeview.Settings{Overlay: string(mode)}.PodMTU(1500, self)
}

// benchPath sets the lab to one path and measures it: bytes per second of
// the stream, round trips per second.
func benchPath(b *testing.B, l *lab, path string) map[string]float64 {
	cfg := never
	if path == "vxlan" {
		cfg = always
	}
	l.sync(b, cfg)
	mtu := strconv.Itoa(ipv4PodMTU(cfg.Mode))
	for _, n := range []*labNode{l.node(1), l.node(2)} {
		n.ns.MustExec(b, "ip", "link", "set", n.podLink, "mtu", mtu)
		n.pod.MustExec(b, "ip", "link", "set", "eth0", "mtu", mtu)
	}
	dst := net.JoinHostPort(l.node(2).podIP, "9000")
	out := map[string]float64{}
	b.Run(path+"/stream", func(b *testing.B) {
		c := benchConn(b, l.node(1), dst, 's')
		buf := make([]byte, 128<<10)
		b.SetBytes(int64(len(buf)))
		start := time.Now()
		for b.Loop() {
			if _, err := c.Write(buf); err != nil {
				b.Fatal(err)
			}
		}
		out[path+"/stream"] = float64(b.N*len(buf)) / time.Since(start).Seconds()
	})
	b.Run(path+"/rr", func(b *testing.B) {
		c := benchConn(b, l.node(1), dst, 'r')
		buf := make([]byte, 64)
		start := time.Now()
		for b.Loop() {
			if _, err := c.Write(buf); err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(c, buf); err != nil {
				b.Fatal(err)
			}
		}
		out[path+"/rr"] = float64(b.N) / time.Since(start).Seconds()
	})
	return out
}

// benchConn connects pod1 to the bench server in mode 's' (sink) or 'r'
// (64-byte echo).
func benchConn(b *testing.B, from *labNode, dst string, mode byte) net.Conn {
	b.Helper()
	var c net.Conn
	if err := from.pod.Do(func() (err error) { c, err = net.DialTimeout("tcp", dst, timeout); return err }); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	if _, err := c.Write([]byte{mode}); err != nil {
		b.Fatal(err)
	}
	return c
}

// answerBench answers one bench connection: its first byte picks the mode,
// 's' a stream it discards, anything else 64-byte messages it echoes.
func answerBench(c net.Conn) {
	mode := make([]byte, 1)
	if _, err := io.ReadFull(c, mode); err != nil {
		return
	}
	if mode[0] == 's' {
		io.Copy(io.Discard, c)
		return
	}
	buf := make([]byte, 64)
	for {
		if _, err := io.ReadFull(c, buf); err != nil {
			return
		}
		if _, err := c.Write(buf); err != nil {
			return
		}
	}
}
