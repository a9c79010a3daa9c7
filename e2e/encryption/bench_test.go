package encryption

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
)

// Per sample: one TCP stream moves streamBytes; the request/response loop
// makes rounds round trips of 64 bytes each way.
const (
	streamBytes = 256 << 20
	rounds      = 5000
)

// BenchmarkEncryption compares, between two nodes on two subnets behind a
// router, one TCP stream's throughput and the rate of 64-byte requests
// and responses: (a) pod to pod through netplane's WireGuard (userspace),
// (a') the same node to node, (b) pod to pod through netplane's VXLAN (the
// same cluster switched to --encryption=none), (c) pod to pod and (c') node
// to node through a standalone wireguard-go in the same node namespaces,
// built by `make anchors` from the module netplane links and configured
// with `wg`, with the same MTU (1440). Also the CPU seconds the tunnel's
// processes spent per GB moved (the two agents, the two wireguard-go
// processes; VXLAN runs in the kernel's softirq, which no process is
// charged for). Run it with -benchtime 1x.
func BenchmarkEncryption(b *testing.B) {
	wggo := framework.RequireBinary(b, "wireguard-go")
	_, err := os.Stat("/usr/bin/wg")
	framework.Require(b, err == nil, "wg (Debian's wireguard-tools: hack/install-tools.sh)")
	logLoad(b)
	defer logLoad(b)
	c := newCluster(b, 2, v1alpha1.EncryptionWireGuard)
	src, dst := c.nodes[0], c.nodes[1]
	type result struct{ mbps, rr float64 }
	results := map[string]result{}
	// Each figure is the median of reps: one stream of 256 MB lasts under a
	// second, and on this shared machine single ones moved by a fifth.
	const reps = 5
	measure := func(name string, from, to *netns.NS, addr string, procs func() []int) {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				var mbps, rr, cpu []float64
				for range reps {
					cpu0 := cpuSeconds(procs())
					mbps = append(mbps, stream(b, from, to, addr))
					cpu = append(cpu, (cpuSeconds(procs())-cpu0)/(float64(streamBytes)/1e9))
					rr = append(rr, requestResponse(b, from, to, addr))
				}
				r := result{median(mbps), median(rr)}
				b.ReportMetric(r.mbps, "MB/s")
				b.ReportMetric(r.rr, "rr/s")
				b.ReportMetric(median(cpu), "cpu-s/GB")
				b.Logf("%s: %.1f MB/s, %.0f rr/s, %.2f CPU s/GB in the tunnel's processes (medians of %d)", name, r.mbps, r.rr, median(cpu), reps)
				results[name] = r
			}
		})
	}
	agents := func() []int { return []int{src.Proc.Cmd.Process.Pid, dst.Proc.Cmd.Process.Pid} }
	measure("netplane-wireguard", src.pod.NS, dst.pod.NS, dst.pod.IP, agents)
	// Node to node, as the standalone anchor measures: no pod veth, bridge
	// or pod-side rules on the way; node2's address on its device.
	measure("netplane-wireguard-node", src.NS, dst.NS, "10.244.2.0", agents)
	for _, n := range c.nodes {
		c.restart(n, v1alpha1.EncryptionNone)
	}
	framework.Eventually(b, 30*time.Second, "pods reach each other through the overlay", func() error {
		_, err := src.pod.NS.SeenTCP(at(dst.pod.IP))
		return err
	})
	measure("netplane-vxlan", src.pod.NS, dst.pod.NS, dst.pod.IP, agents)
	pids := standalone(b, wggo, c)
	measure("wireguard-go", src.pod.NS, dst.pod.NS, dst.pod.IP, func() []int { return pids })
	measure("wireguard-go-node", src.NS, dst.NS, "10.99.0.2", func() []int { return pids })
	for _, r := range [][2]string{
		{"netplane-wireguard", "wireguard-go"}, {"netplane-wireguard-node", "wireguard-go-node"}, {"netplane-wireguard", "netplane-vxlan"},
	} {
		x, y := results[r[0]], results[r[1]]
		b.Logf("%s / %s: throughput %.2f×, request rate %.2f×", r[0], r[1], x.mbps/y.mbps, x.rr/y.rr)
	}
}

// stream sends streamBytes from `from` to a sink in `to` on addr:9000 and
// returns MB/s.
func stream(b *testing.B, from, to *netns.NS, addr string) float64 {
	l, err := to.Listen(net.JoinHostPort(addr, "0"))
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	done := make(chan int64, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			done <- 0
			return
		}
		n, _ := io.Copy(io.Discard, c)
		c.Close()
		done <- n
	}()
	c, err := from.Dial("tcp", l.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 256<<10)
	start := time.Now()
	for sent := 0; sent < streamBytes; sent += len(buf) {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	c.Close()
	if n := <-done; n != streamBytes {
		b.Fatalf("the sink got %d bytes of %d", n, streamBytes)
	}
	return float64(streamBytes) / 1e6 / time.Since(start).Seconds()
}

// requestResponse makes rounds 64-byte round trips on one connection to
// an echo in `to` and returns their rate.
func requestResponse(b *testing.B, from, to *netns.NS, addr string) float64 {
	l, err := to.Listen(net.JoinHostPort(addr, "0"))
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err == nil {
			io.Copy(c, c)
			c.Close()
		}
	}()
	c, err := from.Dial("tcp", l.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	msg := make([]byte, 64)
	start := time.Now()
	for range rounds {
		if _, err := c.Write(msg); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(r, msg); err != nil {
			b.Fatal(err)
		}
	}
	return rounds / time.Since(start).Seconds()
}

// standalone is the anchor: in the same two node namespaces, with the
// agents stopped (their nftables tables, the pods' bridge and veths stay as
// they were), wireguard-go on a TUN device configured with wg, MTU 1440,
// 10.99.0.1 and 10.99.0.2 on the tunnel, each node's pod CIDR routed into
// it: the same userspace code on the same path, with nothing of netplane
// around it. wireguard-go keeps its control socket in /var/run/wireguard:
// the device names are unique to this process, and the sockets (and the
// folder, when this made it) are removed afterwards.
func standalone(b *testing.B, wggo string, c *cluster) (pids []int) {
	const sockDir = "/var/run/wireguard"
	if _, err := os.Stat(sockDir); os.IsNotExist(err) {
		b.Cleanup(func() { os.Remove(sockDir) }) // only when empty
	}
	names, pubs := make([]string, len(c.nodes)), make([]string, len(c.nodes))
	for i, n := range c.nodes {
		n.Proc.Stop(10 * time.Second)
		names[i] = fmt.Sprintf("sa%d-%d", i+1, os.Getpid()%100000)
		cmd := n.NS.Command(wggo, "-f", names[i])
		cmd.Env = append(os.Environ(), "WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD=1")
		p, err := n.NS.StartCmd(cmd, filepath.Join(b.TempDir(), "wireguard-go.log"))
		if err != nil {
			b.Fatal(err)
		}
		sock := filepath.Join(sockDir, names[i]+".sock")
		b.Cleanup(func() { p.Stop(5 * time.Second); os.Remove(sock) })
		pids = append(pids, p.Cmd.Process.Pid)
		framework.Eventually(b, 10*time.Second, "wireguard-go's socket", func() error {
			_, err := os.Stat(sock)
			return err
		})
		key := strings.TrimSpace(n.NS.MustExec(b, "wg", "genkey"))
		keyFile := filepath.Join(b.TempDir(), "key")
		if err := os.WriteFile(keyFile, []byte(key+"\n"), 0o600); err != nil {
			b.Fatal(err)
		}
		n.NS.MustExec(b, "wg", "set", names[i], "listen-port", "51820", "private-key", keyFile)
		n.NS.MustExec(b, "ip", "link", "set", names[i], "mtu", "1440", "up")
		n.NS.MustExec(b, "ip", "addr", "add", fmt.Sprintf("10.99.0.%d/24", i+1), "dev", names[i])
		pubs[i] = strings.TrimSpace(n.NS.MustExec(b, "wg", "show", names[i], "public-key"))
	}
	for i, n := range c.nodes {
		j := 1 - i
		n.NS.MustExec(b, "wg", "set", names[i], "peer", pubs[j], "endpoint", c.nodes[j].IP+":51820",
			"allowed-ips", fmt.Sprintf("10.99.0.%d/32,%s", j+1, podCIDR(j+1)))
		n.NS.MustExec(b, "ip", "route", "replace", podCIDR(j+1), "dev", names[i])
	}
	src, dst := c.nodes[0], c.nodes[1]
	framework.Eventually(b, 10*time.Second, "pods through the standalone tunnel", func() error {
		_, err := src.pod.NS.SeenTCP(at(dst.pod.IP))
		return err
	})
	return pids
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// cpuSeconds is the user and system CPU time of the processes, from
// /proc/PID/stat, in seconds.
func cpuSeconds(pids []int) float64 {
	var sum time.Duration
	for _, pid := range pids {
		sum += framework.CPUTime(pid)
	}
	return sum.Seconds()
}

func logLoad(b *testing.B) {
	if load, err := os.ReadFile("/proc/loadavg"); err == nil {
		b.Logf("load average: %s", strings.TrimSpace(string(load)))
	}
}
