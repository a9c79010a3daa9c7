package overlay_test

import (
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
	"github.com/netplane/netplane/overlay"
)

const (
	podRounds  = 5               // turns of each path in BenchmarkPodToPodAgainstFlannel
	podMeasure = 2 * time.Second // each of stream and request/response, per turn
	// BenchmarkNodeToKernelAgainstFlannel: runs of each contender, Nodes
	// there before it starts, Nodes created one at a time per run.
	appearRounds     = 2
	appearBackground = 1000
	appearSamples    = 100
	appearPace       = 200 * time.Millisecond
)

// BenchmarkPodToPodAgainstFlannel measures traffic from the pod on node1
// to the pod on node2 (one underlay subnet) over three paths, in the same
// run: direct routes (netplane's overlay in mode never, pod MTU 1500),
// netplane's VXLAN (mode always) and Flannel's (flanneld's vxlan backend
// without DirectRouting, the real process on each node against the test
// API server); both tunnels on UDP 4789, VNI 1, pod MTU 1450. Each turn
// sets up its path from nothing, moves one TCP stream for podMeasure, then
// 64-byte requests and responses on one connection for as long. The paths
// take turns for podRounds rounds, each round starting with the next
// path, so that other load on the machine falls on all of them alike. It
// logs every turn and, per path, the best and the median turn, and the
// ratios netplane/direct, flannel/direct and netplane/flannel (-v).
func BenchmarkPodToPodAgainstFlannel(b *testing.B) {
	bin := framework.RequireBinary(b, "flanneld")
	framework.RequireBinary(b, "iptables") // flanneld runs it at start, even in nftables mode
	framework.RequireBinary(b, "nft")
	api := framework.StartAPIServer(b, framework.Options{})
	l := newLab(b)
	two := []*labNode{l.node(1), l.node(2)}
	var facts []overlay.Node
	var flannels []*flanneld
	for _, n := range two {
		f := overlay.Node{Name: n.Name, IPs: n.IPs[:1], PodCIDRs: n.PodCIDRs[:1]} // IPv4, as Flannel here
		facts = append(facts, f)
		createNode(b, api, flannelNode(f, false))
		flannels = append(flannels, newFlanneld(b, bin, api, n.ns, n.Name, "eth0", "10.244.0.0/16"))
	}
	sink, err := l.node(2).pod.Listen(":9000")
	if err != nil {
		b.Fatal(err)
	}
	defer sink.Close()
	go serveBench(sink)
	dst := net.JoinHostPort(l.node(2).podIP, "9000")

	paths := []podPath{
		{name: "direct", dev: "eth0", up: func() int {
			l.syncFacts(b, never, facts)
			return overlay.PodMTU(0, overlay.Never, 1500, overlay.IPv4)
		}},
		{name: "netplane", dev: overlay.DeviceV4, up: func() int {
			l.syncFacts(b, always, facts)
			return overlay.PodMTU(0, overlay.Always, 1500, overlay.IPv4)
		}},
		{name: "flannel", dev: "flannel.1", up: func() int {
			for i, f := range flannels {
				clearNetplane(b, two[i].ns)
				f.start(b)
			}
			return 0 // known once it runs
		}, down: func() {
			for _, f := range flannels {
				f.stop(b)
			}
		}, failed: func() string {
			for _, f := range flannels {
				if f.proc.Exited() {
					return fmt.Sprintf("flanneld on %s exited; its log:\n%s", f.node, f.tail())
				}
			}
			return ""
		}},
	}
	results := map[string][]podRates{}
	for round := range podRounds {
		for i := range paths {
			p := paths[(round+i)%len(paths)]
			mtu := p.up()
			waitRoutes(b, two, facts, p)
			if mtu == 0 {
				mtu = flannels[0].mtu(b)
			}
			setPodMTU(b, two, mtu)
			r := measurePods(b, l.node(1), dst)
			if p.down != nil {
				p.down()
			}
			b.Logf("round %d %-8s one stream %.2f GB/s, 64-byte request/response %.0f/s (pod MTU %d; load %s)",
				round+1, p.name, r.stream/1e9, r.rr, mtu, framework.LoadAverage())
			results[p.name] = append(results[p.name], r)
		}
	}
	reportPods(b, results)
}

// podPath is one way from pod to pod: up sets it up from whatever the
// previous turn left, and returns the pod MTU it implies (0: Flannel's,
// from its subnet file); down, if set, stops what up started. Each node's
// route to the other's pod CIDR goes through dev. failed, if set, says why
// the routes will not come (a process that ended).
type podPath struct {
	name, dev string
	up        func() int
	down      func()
	failed    func() string
}

// waitRoutes waits until each node's route to the other's pod CIDR goes
// through p.dev: at once after netplane's syncs, which are synchronous,
// once flanneld has started and programmed it for Flannel.
func waitRoutes(b *testing.B, nodes []*labNode, facts []overlay.Node, p podPath) {
	for i, n := range nodes {
		other := facts[1-i].PodCIDRs[0].String()
		deadline := time.Now().Add(time.Minute)
		for {
			out, _ := n.ns.Exec("ip", "-o", "route", "show", other)
			if strings.Contains(out, "dev "+p.dev+" ") {
				break
			}
			why := "not after a minute"
			if p.failed != nil && p.failed() != "" {
				why = p.failed()
			} else if time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
				continue
			}
			b.Fatalf("%s, %s: the route to %s is %q, want one through %s: %s", p.name, n.Name, other, out, p.dev, why)
		}
	}
}

func setPodMTU(b *testing.B, nodes []*labNode, mtu int) {
	for _, n := range nodes {
		n.ns.MustExec(b, "ip", "link", "set", "vpod", "mtu", strconv.Itoa(mtu))
		n.pod.MustExec(b, "ip", "link", "set", "eth0", "mtu", strconv.Itoa(mtu))
	}
}

// podRates are one turn's figures: bytes per second of one TCP stream,
// round trips per second of 64-byte requests and responses.
type podRates struct{ stream, rr float64 }

// measurePods runs the two measurements from the pod of from to the
// bench server at dst (serveBench), each for podMeasure.
func measurePods(b *testing.B, from *labNode, dst string) podRates {
	var r podRates
	c := benchConn(b, from, dst, 's')
	buf := make([]byte, 128<<10)
	start := time.Now()
	c.SetWriteDeadline(start.Add(podMeasure))
	var sent int
	for {
		n, err := c.Write(buf)
		sent += n
		if err != nil {
			break // the deadline
		}
	}
	r.stream = float64(sent) / time.Since(start).Seconds()
	c.Close()

	c = benchConn(b, from, dst, 'r')
	defer c.Close()
	msg := make([]byte, 64)
	start = time.Now()
	var trips int
	for time.Since(start) < podMeasure {
		if _, err := c.Write(msg); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, msg); err != nil {
			b.Fatal(err)
		}
		trips++
	}
	r.rr = float64(trips) / time.Since(start).Seconds()
	return r
}

// reportPods logs the best and the median turn of each path and their
// ratios, and reports the median ratios as the benchmark's metrics.
func reportPods(b *testing.B, results map[string][]podRates) {
	kinds := []struct {
		name string
		of   func(podRates) float64
		unit string
		div  float64
	}{
		{"one stream", func(r podRates) float64 { return r.stream }, "GB/s", 1e9},
		{"64-byte request/response", func(r podRates) float64 { return r.rr }, "/s", 1},
	}
	for _, k := range kinds {
		for _, stat := range []string{"best", "median"} {
			v := map[string]float64{}
			for path, rs := range results {
				var xs []float64
				for _, r := range rs {
					xs = append(xs, k.of(r))
				}
				slices.Sort(xs)
				if stat == "best" {
					v[path] = xs[len(xs)-1]
				} else {
					v[path] = xs[len(xs)/2]
				}
			}
			b.Logf("%s, %s of %d: direct %.2f%s, netplane %.2f%s, flannel %.2f%s; netplane/direct %.2f, flannel/direct %.2f, netplane/flannel %.2f",
				k.name, stat, podRounds, v["direct"]/k.div, k.unit, v["netplane"]/k.div, k.unit, v["flannel"]/k.div, k.unit,
				v["netplane"]/v["direct"], v["flannel"]/v["direct"], v["netplane"]/v["flannel"])
			if stat == "median" {
				metric := strings.Fields(k.name)[1] // "stream", "request/response"
				b.ReportMetric(v["netplane"]/v["flannel"], "netplane/flannel-"+strings.ReplaceAll(metric, "/", "-"))
			}
		}
	}
}

// BenchmarkNodeToKernelAgainstFlannel measures how soon a node's kernel
// follows the Node objects, for netplane's overlay (mode always, driven by
// a Node informer as the node role drives it) and for flanneld (the real
// process, vxlan backend), in the same run. The API server holds
// appearBackground Nodes on another subnet; each contender, in turns,
// appearRounds times, in a fresh namespace:
//
//  1. starts, and is timed until the route, neighbour and FDB entry of
//     every one of those Nodes are in the kernel: from its start (for
//     netplane the informer's, in the test process; for Flannel the
//     process's, so its own start-up and lease are included) and from the
//     first of those entries to the last (the programming alone);
//  2. then appearSamples more Nodes are created, one at a time, appearPace
//     apart, each timed from its API create until its three entries are in
//     the kernel, and deleted after the run.
//
// The Nodes carry the annotations a node's own flanneld writes; in a
// cluster Flannel's time also includes that node's flanneld starting and
// writing them, which is not measured here. It logs each start, and p50,
// p99 and the maximum of the Node times per contender (-v).
func BenchmarkNodeToKernelAgainstFlannel(b *testing.B) {
	bin := framework.RequireBinary(b, "flanneld")
	framework.RequireBinary(b, "iptables")
	framework.RequireBinary(b, "nft")
	api := framework.StartAPIServer(b, framework.Options{})
	nodes := scaleNodes(appearBackground+appearSamples, false)
	self, background, samples := nodes[0], nodes[1:appearBackground+1], nodes[appearBackground+1:]
	createNode(b, api, flannelNode(self, false))
	for _, n := range background {
		createNode(b, api, flannelNode(n, true))
	}
	contenders := []struct {
		name  string
		start func(ns *netns.NS) (stop func())
	}{
		{"netplane", func(ns *netns.NS) func() { return netplaneAgent(b, api, handleIn(b, ns), self.Name, always) }},
		{"flannel", func(ns *netns.NS) func() {
			f := newFlanneld(b, bin, api, ns, self.Name, "ul0", "172.16.0.0/12")
			f.start(b)
			return func() { f.stop(b) }
		}},
	}
	took, creates := map[string][]time.Duration{}, map[string][]time.Duration{}
	for round := range appearRounds {
		for i := range contenders {
			c := contenders[(round+i)%len(contenders)]
			ns, _ := scaleNS(b)
			w := watchKernel(b, ns)
			start := time.Now()
			stop := c.start(ns)
			first, last, err := w.appeared(background, 2*time.Minute)
			if err != nil {
				b.Fatalf("%s, the %d Nodes there before it started: %v", c.name, len(background), err)
			}
			b.Logf("round %d %-8s %d Nodes in the kernel %v after its start, %v from the first entry to the last (load %s)",
				round+1, c.name, len(background), last.Sub(start).Round(time.Millisecond), last.Sub(first).Round(time.Millisecond), framework.LoadAverage())
			for _, n := range samples {
				time.Sleep(appearPace)
				start := time.Now()
				createNode(b, api, flannelNode(n, true))
				creates[c.name] = append(creates[c.name], time.Since(start))
				_, at, err := w.appeared([]overlay.Node{n}, 30*time.Second)
				if err != nil {
					b.Fatalf("%s, Node %s: %v", c.name, n.Name, err)
				}
				took[c.name] = append(took[c.name], at.Sub(start))
			}
			stop()
			deleteNodes(b, api, samples)
			if err := ns.Delete(); err != nil {
				b.Fatal(err)
			}
		}
	}
	p := map[string][3]time.Duration{}
	for name, ds := range took {
		p[name] = percentiles(ds)
		b.Logf("%s: a new Node's route, neighbour and FDB entry in the kernel after p50 %v, p99 %v, max %v (%d samples, budget 100ms; the API create itself p50 %v)",
			name, p[name][0].Round(10*time.Microsecond), p[name][1].Round(10*time.Microsecond), p[name][2].Round(10*time.Microsecond),
			len(ds), percentiles(creates[name])[0].Round(10*time.Microsecond))
	}
	b.Logf("netplane/flannel: p50 %.2f, p99 %.2f", ratio(p["netplane"][0], p["flannel"][0]), ratio(p["netplane"][1], p["flannel"][1]))
	b.ReportMetric(float64(p["netplane"][0].Microseconds())/1e3, "netplane-p50-ms")
	b.ReportMetric(float64(p["netplane"][1].Microseconds())/1e3, "netplane-p99-ms")
	b.ReportMetric(float64(p["flannel"][0].Microseconds())/1e3, "flannel-p50-ms")
	b.ReportMetric(float64(p["flannel"][1].Microseconds())/1e3, "flannel-p99-ms")
}

// percentiles are p50, p99 and the maximum of ds (sorted in place).
func percentiles(ds []time.Duration) [3]time.Duration {
	slices.Sort(ds)
	return [3]time.Duration{ds[len(ds)/2], ds[(len(ds)*99+99)/100-1], ds[len(ds)-1]}
}

func ratio(a, b time.Duration) float64 { return float64(a) / float64(b) }

// deleteNodes deletes the Nodes of nodes and waits until they are gone.
func deleteNodes(b *testing.B, api *framework.APIServer, nodes []overlay.Node) {
	ctx := framework.Ctx(b)
	for _, n := range nodes {
		if err := api.Client.CoreV1().Nodes().Delete(ctx, n.Name, metav1.DeleteOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	framework.Eventually(b, 30*time.Second, "Nodes deleted", func() string {
		for _, n := range nodes {
			if _, err := api.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{}); err == nil {
				return "Node " + n.Name + " is still there"
			}
		}
		return ""
	})
}
