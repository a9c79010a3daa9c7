package wireguard_test

import (
	"bufio"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
)

// Per operation: the stream moves streamBytes, the request/response loop
// makes rounds round trips of 64 bytes each way; with -benchtime 1x (make
// bench) one operation is one measurement long enough to mean something.
const (
	streamBytes = 64 << 20
	rounds      = 2000
)

// BenchmarkTunnel measures the userspace device between two nodes on two
// subnets behind the router, from node 1's pod address to node 2's: one
// TCP stream's throughput (MB/s) and the rate of 64-byte requests and
// responses on one connection (rr/s). The inner MTU is 1420, the
// underlay's 1500 less WireGuard's IPv4 overhead.
func BenchmarkTunnel(b *testing.B) {
	logLoad(b)
	defer logLoad(b)
	l := newLab(b, 2)
	l.syncAll(b)
	a, dst := l.nodes[0], l.nodes[1]
	sink, err := dst.ns.Listen(net.JoinHostPort(dst.podIP(), "9000"))
	if err != nil {
		b.Fatal(err)
	}
	framework.Serve(b, sink, func(c net.Conn) { io.Copy(io.Discard, c) })
	b.Run("stream", func(b *testing.B) {
		c := dialFrom(b, a.ns, net.JoinHostPort(dst.podIP(), "9000"))
		buf := make([]byte, 256<<10)
		b.SetBytes(streamBytes)
		for b.Loop() {
			for sent := 0; sent < streamBytes; sent += len(buf) {
				if _, err := c.Write(buf); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
	b.Run("rr", func(b *testing.B) {
		c := dialFrom(b, a.ns, at(dst.podIP()))
		if _, err := io.WriteString(c, "echo\n"); err != nil {
			b.Fatal(err)
		}
		r := bufio.NewReader(c)
		msg := make([]byte, 64)
		start := time.Now()
		for b.Loop() {
			for range rounds {
				if _, err := c.Write(msg); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(r, msg); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(float64(b.N*rounds)/time.Since(start).Seconds(), "rr/s")
	})
}

func dialFrom(b *testing.B, ns *netns.NS, addr string) net.Conn {
	b.Helper()
	c, err := ns.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return c
}

// logLoad logs the machine's load average: other work shares it.
func logLoad(b *testing.B) {
	if load, err := os.ReadFile("/proc/loadavg"); err == nil {
		b.Logf("load average: %s", strings.TrimSpace(string(load)))
	}
}
