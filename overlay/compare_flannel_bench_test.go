package overlay_test

import (
	"errors"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/nodeview"
	"github.com/netplane/netplane/overlay"
)

const (
	podRounds  = 10              // turns of each path in BenchmarkPodToPodAgainstFlannel; even, so each tunnel goes first as often
	podMeasure = 2 * time.Second // each of stream and request/response, per turn
	// BenchmarkNodeToKernelAgainstFlannel: runs of each contender, Nodes
	// there before it starts (NETPLANE_BENCH_OVERLAY_NODES overrides it),
	// Nodes created one at a time per run.
	appearRounds     = 2
	appearBackground = 1000
	appearSamples    = 100
	appearPace       = 200 * time.Millisecond
)

// BenchmarkPodToPodAgainstFlannel measures traffic from the pod on node1
// to the pod on node2 (one underlay subnet) over three paths, in the same
// run, each set up by real processes on both nodes against the test API
// server: direct routes (netplane --role=node --overlay=never, pod MTU
// 1500), netplane's VXLAN (--overlay=always) and Flannel's (flanneld's
// vxlan backend without DirectRouting); both tunnels on UDP 4789, VNI 1,
// pod MTU 1450. In Flannel's turns the nftables tables, sysctls and bridge
// netplane's node role made stay, standing in for the kube-proxy and CNI
// plugin a Flannel node runs, so that the paths differ in the overlay
// alone. Each turn moves one TCP stream for podMeasure, then 64-byte
// requests and responses on one connection for as long. The paths take
// turns for podRounds rounds: netplane, flannel, direct, then flannel,
// netplane, direct, and so on, so that each tunnel goes first in half the
// rounds, follows the other tunnel in half and direct in the other half,
// and other load on the machine falls on both alike. It logs every turn
// and, per path, the best and the median turn, the ratios of the medians
// and, for the two tunnels, the median and range of their ratios within
// one round (-v).
//
// NETPLANE_BENCH_OVERLAY_AA=1 runs netplane's tunnel in flannel's turns
// too (named netplane-aa), without flanneld: the spread of that ratio is
// what the machine's noise alone gives.
func BenchmarkPodToPodAgainstFlannel(b *testing.B) {
	bin := framework.RequireBinary(b, "flanneld")
	framework.RequireBinary(b, "iptables") // flanneld runs it at start, even in nftables mode
	framework.RequireBinary(b, "nft")
	api := framework.StartAPIServer(b, framework.Options{})
	l := newLab(b)
	two := []*labNode{l.node(1), l.node(2)}
	var facts []nodeview.Node
	var agents []*agent
	for _, n := range two {
		f := nodeview.Node{Name: n.Name, IPs: n.IPs[:1], PodCIDRs: n.PodCIDRs[:1]} // IPv4, as Flannel here
		facts = append(facts, f)
		createNode(b, api, flannelNode(f, false))
		agents = append(agents, newAgent(b, api, n.ns))
	}
	sink, err := l.node(2).pod.Listen(":9000")
	if err != nil {
		b.Fatal(err)
	}
	framework.Serve(b, sink, answerBench)
	dst := net.JoinHostPort(l.node(2).podIP, "9000")

	netplane, other := podPath{"netplane", overlay.Always, overlay.DeviceV4}, podPath{"flannel", "", "flannel.1"}
	if os.Getenv("NETPLANE_BENCH_OVERLAY_AA") == "1" {
		other = podPath{"netplane-aa", overlay.Always, overlay.DeviceV4}
	}
	direct := podPath{"direct", overlay.Never, "eth0"}
	results := map[string][]podRates{}
	for round := range podRounds {
		order := []podPath{netplane, other, direct}
		if round%2 == 1 {
			order[0], order[1] = other, netplane
		}
		for _, p := range order {
			for j, a := range agents {
				if p.mode == "" {
					clearNetplane(b, a.ns)
					a.startFlanneld(b, bin, facts[j].Name, "eth0", "10.244.0.0/16")
				} else {
					a.startNetplane(b, facts[j].Name, p.mode, "10.244.0.0/16")
				}
			}
			waitRoutes(b, facts, agents, p)
			mtu := ipv4PodMTU(p.mode)
			if p.mode == "" {
				mtu = agents[0].flannelMTU(b)
			}
			setPodMTU(b, two, mtu)
			r := measurePods(b, l.node(1), dst)
			for _, a := range agents {
				a.stop()
				if p.mode == "" {
					clearFlannel(b, a.ns)
				}
			}
			b.Logf("round %d %-8s one stream %.2f GB/s, 64-byte request/response %.0f/s (pod MTU %d; load %s)",
				round+1, p.name, r.stream/1e9, r.rr, mtu, framework.LoadAverage())
			results[p.name] = append(results[p.name], r)
		}
	}
	reportPods(b, results, other.name)
}

// podPath is one way from pod to pod: netplane's node role in mode, or
// flanneld when mode is empty; each node's route to the other's pod CIDR
// then goes through dev.
type podPath struct {
	name string
	mode overlay.Mode
	dev  string
}

// waitRoutes waits until each node's route to the other's pod CIDR goes
// through p.dev, and fails early when an agent's process ends.
func waitRoutes(b testing.TB, facts []nodeview.Node, agents []*agent, p podPath) {
	for i, a := range agents {
		other := facts[1-i].PodCIDRs[0].String()
		deadline := time.Now().Add(time.Minute)
		for {
			out, _ := a.ns.Exec("ip", "-o", "route", "show", other)
			if strings.Contains(out, "dev "+p.dev+" ") {
				break
			}
			why := a.exited()
			if why == "" && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
				continue
			}
			if why == "" {
				why = "not after a minute; the log of " + a.name + ":\n" + a.proc.Tail(30)
			}
			b.Fatalf("%s, %s: the route to %s is %q, want one through %s: %s", p.name, facts[i].Name, other, out, p.dev, why)
		}
	}
}

// setPodMTU gives the pods, their veths and the bridge the MTU a CNI
// plugin of the path would give them.
func setPodMTU(b testing.TB, nodes []*labNode, mtu int) {
	for _, n := range nodes {
		n.ns.MustExec(b, "ip", "link", "set", n.podLink, "mtu", strconv.Itoa(mtu))
		n.pod.MustExec(b, "ip", "link", "set", "eth0", "mtu", strconv.Itoa(mtu))
		n.ns.MustExec(b, "ip", "link", "set", "cni0", "mtu", strconv.Itoa(mtu))
	}
}

// podRates are one turn's figures: bytes per second of one TCP stream,
// the stream's CPU seconds per GB, and round trips per second of 64-byte
// requests and responses.
type podRates struct{ stream, cpu, rr float64 }

// measurePods runs the two measurements from the pod of from to the
// bench server at dst (answerBench), each for podMeasure.
func measurePods(b *testing.B, from *labNode, dst string) podRates {
	var r podRates
	c := benchConn(b, from, dst, 's')
	buf := make([]byte, 128<<10)
	cpu := processCPU(b)
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
	r.cpu = (processCPU(b) - cpu).Seconds() / float64(sent) * 1e9
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

// processCPU is the CPU time of this process, which holds both ends of the
// bench connection: the threads that send and receive also run most of
// the kernel's work on the path (veths, bridge, tunnel, netfilter), in
// their softirqs, so its time per GB is the cost of the path: within a
// round it moved 0.82-1.18x where the rate moved 0.44-1.77x (2026-12-02,
// load 13-39).
func processCPU(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportPods logs the best and the median turn of each path and the
// ratios of the medians; for netplane against other, also the median and
// the range of their ratios within one round, which share the machine's
// load of the moment. It reports the ratios of the medians as the
// benchmark's metrics.
func reportPods(b *testing.B, results map[string][]podRates, other string) {
	kinds := []struct {
		name, metric string
		of           func(podRates) float64
		unit         string
		div          float64
		best         func([]float64) float64
	}{
		{"one stream", "stream", func(r podRates) float64 { return r.stream }, "GB/s", 1e9, slices.Max[[]float64]},
		{"one stream's CPU time per GB", "stream-cpu", func(r podRates) float64 { return r.cpu }, "s", 1, slices.Min[[]float64]},
		{"64-byte request/response", "request-response", func(r podRates) float64 { return r.rr }, "/s", 1, slices.Max[[]float64]},
	}
	for _, k := range kinds {
		best, med := map[string]float64{}, map[string]float64{}
		for path, rs := range results {
			var xs []float64
			for _, r := range rs {
				xs = append(xs, k.of(r))
			}
			best[path], med[path] = k.best(xs), median(xs)
		}
		var paired []float64
		for i, r := range results["netplane"] {
			paired = append(paired, k.of(r)/k.of(results[other][i]))
		}
		for _, v := range []struct {
			stat string
			of   map[string]float64
		}{{"best", best}, {"median", med}} {
			b.Logf("%s, %s of %d: direct %.2f%s, netplane %.2f%s, %s %.2f%s; netplane/direct %.2f, %s/direct %.2f, netplane/%s %.2f",
				k.name, v.stat, podRounds, v.of["direct"]/k.div, k.unit, v.of["netplane"]/k.div, k.unit, other, v.of[other]/k.div, k.unit,
				v.of["netplane"]/v.of["direct"], other, v.of[other]/v.of["direct"], other, v.of["netplane"]/v.of[other])
		}
		b.Logf("%s, netplane/%s within a round: median %.2f, range %.2f to %.2f",
			k.name, other, median(paired), slices.Min(paired), slices.Max(paired))
		b.ReportMetric(med["netplane"]/med[other], "netplane/"+other+"-"+k.metric)
	}
}

// median is the middle of xs, or the mean of the two middle ones.
func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	return (s[(len(s)-1)/2] + s[len(s)/2]) / 2
}

// BenchmarkNodeToKernelAgainstFlannel measures how soon a node's kernel
// follows the Node objects, for netplane --role=node --overlay=always and
// for flanneld (vxlan backend), both real processes in the node's
// namespace, in the same run. The API server holds appearBackground Nodes
// on another subnet; each contender, in turns, appearRounds times, in a
// fresh namespace:
//
//  1. starts, and is timed until the route, neighbour and FDB entry of
//     every one of those Nodes are in the kernel: from the process's start
//     and from the first of those entries to the last (the programming
//     alone);
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
	count := appearBackground
	if v := os.Getenv("NETPLANE_BENCH_OVERLAY_NODES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n+appearSamples > 3000 {
			b.Fatalf("NETPLANE_BENCH_OVERLAY_NODES=%q: want a count of Nodes from 1 to %d", v, 3000-appearSamples)
		}
		count = n
	}
	nodes := scaleNodes(count+appearSamples, false)
	self, background, samples := nodes[0], nodes[1:count+1], nodes[count+1:]
	createNode(b, api, flannelNode(self, false))
	for _, n := range background {
		createNode(b, api, flannelNode(n, true))
	}
	contenders := []struct {
		name  string
		start func(a *agent)
	}{
		{"netplane", func(a *agent) { a.startNetplane(b, self.Name, overlay.Always, "172.16.0.0/12") }},
		{"flannel", func(a *agent) { a.startFlanneld(b, bin, self.Name, "ul0", "172.16.0.0/12") }},
	}
	took, creates := map[string][]time.Duration{}, map[string][]time.Duration{}
	for round := range appearRounds {
		for i := range contenders {
			c := contenders[(round+i)%len(contenders)]
			ns, _ := scaleNS(b)
			w := watchKernel(b, ns)
			a := newAgent(b, api, ns)
			start := time.Now()
			c.start(a)
			first, last, err := w.appeared(background, 2*time.Minute)
			if err != nil {
				b.Fatalf("%s, the %d Nodes there before it started: %v; %s", c.name, len(background), err, a.proc.Tail(20))
			}
			b.Logf("round %d %-8s %d Nodes in the kernel %v after its start, %v from the first entry to the last (load %s)",
				round+1, c.name, len(background), last.Sub(start).Round(time.Millisecond), last.Sub(first).Round(time.Millisecond), framework.LoadAverage())
			for _, n := range samples {
				time.Sleep(appearPace)
				start := time.Now()
				createNode(b, api, flannelNode(n, true))
				creates[c.name] = append(creates[c.name], time.Since(start))
				_, at, err := w.appeared([]nodeview.Node{n}, 30*time.Second)
				if err != nil {
					b.Fatalf("%s, Node %s: %v; %s", c.name, n.Name, err, a.proc.Tail(20))
				}
				took[c.name] = append(took[c.name], at.Sub(start))
			}
			a.stop()
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
func deleteNodes(b *testing.B, api *framework.APIServer, nodes []nodeview.Node) {
	ctx := framework.Ctx(b)
	for _, n := range nodes {
		if err := api.Client.CoreV1().Nodes().Delete(ctx, n.Name, metav1.DeleteOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	framework.Eventually(b, 30*time.Second, "Nodes deleted", func() error {
		for _, n := range nodes {
			if _, err := api.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{}); err == nil {
				return errors.New("Node " + n.Name + " is still there")
			}
		}
		return nil
	})
}
