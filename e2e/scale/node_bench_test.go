package scale

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
	"github.com/netplane/netplane/e2e/nftwatch"
)

var viaRelay = flag.Bool("relay", false, "have the node role read pods from a pod relay (netplane --role=relay, in the namespace beside the node's) instead of the API server")

var full = flag.Bool("full", false, "fill the cluster to Kubernetes' published limits (5,000 Nodes, 150,000 pods, 10,000 Services, 10,000 NetworkPolicies) instead of a tenth of them")

// Rounds of each measure.
const (
	changes      = 30               // endpoint changes, and policy changes
	packetRounds = 40               // first-packet rounds, alternating with and without the policy table
	connectsPer  = 100              // connects per round
	churnRate    = 100              // pod changes per second
	churnFor     = 30 * time.Second // how long
	idleFor      = 10 * time.Second // the quiet window before it
)

// BenchmarkNodeAtFieldSizes fills a real API server with a cluster (a tenth
// of Kubernetes' published limits; -full for the limits themselves: 5,000
// Nodes, 150,000 Running pods with their statuses, 10,000 Services of which
// 100 ClusterIP and 50 headless have 250 endpoints, 10,000
// NetworkPolicies), runs one netplane node role in a namespace as Node 0,
// and measures:
//
//   - its first full sync: from the informers' lists to each feature's
//     rules in the kernel (the proxy's and NetworkPolicy's first full
//     "synced" lines, the overlay's first sync with every other Node);
//   - its resident memory after that sync and its peak by the end;
//   - a one-endpoint change and a policy change, each API write to the
//     nftables notification carrying it, p50 and p99 of 30;
//   - the first packet of a new connection from a client pod to a server
//     pod behind Node 0's policy table, against the same with the table
//     bypassed (an accept first in its forward chain), rounds alternating,
//     each between the same two runs of nft;
//   - the bytes per second it receives from the API server idle and under
//     100 pod changes a second.
//
// kube-proxy (nftables mode) then syncs the same Services in a namespace
// of its own (NETPLANE_BENCH_NO_KUBEPROXY=1 leaves it out; it is given 20
// minutes).
func BenchmarkNodeAtFieldSizes(b *testing.B) {
	bin, sizes, api, w := filledCluster(b, benchPods)
	for b.Loop() {
		np := runNode(b, api, w, sizes, bin)
		var kp kubeProxyResult
		if os.Getenv("NETPLANE_BENCH_NO_KUBEPROXY") != "1" {
			kp = runKubeProxy(b, api)
		}
		report(b, np, kp)
	}
}

// nodeResult is what one run of the node role measured.
type nodeResult struct {
	fromStart, fromLists                     time.Duration // the whole first sync
	proxy, policy, overlay                   time.Duration // each feature's, from the lists
	proxyTook, policyTook                    time.Duration // their own "took"
	rssSynced, rssPeak                       int           // KiB
	endpointP50, endpointP99                 time.Duration
	policyP50, policyP99                     time.Duration
	packetNone, packetTable                  time.Duration // first packet p50
	packetNoneP99, packetTableP99            time.Duration
	idleBytesPerSec, churnBytesPerSec, churn float64
	bytesPerSlice, bytesPerPolicy            float64 // received per change
	cpu                                      float64 // CPUs used while idle and churning
}

func runNode(b *testing.B, api *framework.APIServer, w kubernetes.Interface, s Sizes, bin string) (r nodeResult) {
	ns, peer := nodeAndPeer(b)
	var relayArgs []string
	var relay relayRun
	if *viaRelay {
		relay = startRelay(b, api, peer, peerIP, bin)
		relayArgs = []string{"--pod-relay=kube-system/netplane-relay", "--pod-relay-ca-file=" + relay.ca}
	}
	var received atomic.Int64
	fwd := ns.ForwardCounted(b, "127.0.0.1:0", strings.TrimPrefix(api.URL, "https://"), &received)
	kc, tmp := filepath.Join(b.TempDir(), "kubeconfig"), b.TempDir()
	if err := api.WriteKubeconfig(kc, "https://"+fwd, api.Token); err != nil {
		b.Fatal(err)
	}
	t0 := time.Now()
	args := append([]string{"--role=node", "--v=2", "--kubeconfig=" + kc, "--node-name=" + NodeName(0), "--cluster-cidr=" + ClusterCIDR,
		"--health-bind-address=" + healthAddr, "--metrics-bind-address=" + metricsAddr, "--proxy-healthz-bind-address=127.0.0.1:10256",
		"--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0",
		"--cni-conf-dir=" + tmp, "--cni-bin-dir=" + tmp, "--ipam-state-dir=" + tmp, "--bridge=" + bridge, "--pprof-bind-address=" + pprofAddr}, relayArgs...)
	p := ns.Start(b, bin, args...)
	defer p.Stop(10 * time.Second)

	proxyAt, proxyLine := waitLog(b, p, 20*time.Minute, `"synced"`, `type="full"`, "building=")
	policyAt, policyLine := waitLog(b, p, 20*time.Minute, `"synced"`, `type="full"`, "policies=")
	overlayAt := overlaySynced(b, ns, p, s.Nodes-1)
	// Each feature waits for its own lists; the node's sync runs from the
	// first of them to the last feature's rules.
	listed := func(role string) time.Time {
		t, _ := framework.LogLine(p.Log, false, `"caches synced"`, `role="`+role+`"`)
		return t
	}
	proxyLists, policyLists, overlayLists := listed("proxy"), listed("network-policy"), listed("overlay")
	first, last := earlier(proxyLists, policyLists, overlayLists), later(proxyAt, policyAt, overlayAt)
	r.fromStart, r.fromLists = last.Sub(t0), last.Sub(first)
	r.proxy, r.policy, r.overlay = proxyAt.Sub(proxyLists), policyAt.Sub(policyLists), overlayAt.Sub(overlayLists)
	r.proxyTook, r.policyTook = took(proxyLine), took(policyLine)
	r.rssSynced = framework.StatusKiB(p.Cmd.Process.Pid, "VmRSS")
	// The peak so far, after each phase: which one sets the run's peak.
	peakBy := func(phase string) {
		body, _ := get(ns, "http://"+metricsAddr+"/metrics")
		mib := func(name string) float64 { v, _ := metric(body, name); return v / (1 << 20) }
		full := func(what string) float64 {
			v, _ := metric(body, `netplane_node_sync_duration_seconds_`+what+`{feature="network-policy",type="full"}`)
			return v
		}
		b.Logf("node role's peak resident memory by the end of %s: %d MiB (now %d MiB: Go heap in use %.0f MiB, next collection at %.0f, idle %.0f of which released %.0f; runtime in all %.0f MiB); NetworkPolicy's full syncs so far: %.0f, %.2f s in all",
			phase, framework.StatusKiB(p.Cmd.Process.Pid, "VmHWM")/1024, framework.StatusKiB(p.Cmd.Process.Pid, "VmRSS")/1024,
			mib("go_memstats_heap_inuse_bytes"), mib("go_memstats_next_gc_bytes"), mib("go_memstats_heap_idle_bytes"), mib("go_memstats_heap_released_bytes"), mib("go_memstats_sys_bytes"),
			full("count"), full("sum"))
	}
	peakBy("the first sync")
	saveHeap(b, ns, "synced")
	b.Logf("node role: first full sync %v from its first lists (%v from start); from each feature's lists: proxy %v (took %v), NetworkPolicy %v (took %v), overlay %v; VmRSS %d MiB; load %s",
		r.fromLists.Round(time.Millisecond), r.fromStart.Round(time.Millisecond), r.proxy.Round(time.Millisecond), r.proxyTook,
		r.policy.Round(time.Millisecond), r.policyTook, r.overlay.Round(time.Millisecond), r.rssSynced/1024, framework.LoadAverage())

	waitReady(b, ns, p)
	r.packetNone, r.packetNoneP99, r.packetTable, r.packetTableP99 = firstPackets(b, ns)
	peakBy("the first packets")
	mon := nftwatch.New(b, ns)
	defer mon.Close()
	before := received.Load()
	r.endpointP50, r.endpointP99 = endpointChanges(b, w, mon, s)
	r.bytesPerSlice = float64(received.Load()-before) / changes
	peakBy("the endpoint changes")
	before = received.Load()
	r.policyP50, r.policyP99 = policyChanges(b, w, mon, s)
	r.bytesPerPolicy = float64(received.Load()-before) / changes
	peakBy("the policy changes")
	mon.Close() // its notifications would cost the churn below
	cpu0, at0 := framework.CPUTime(p.Cmd.Process.Pid), time.Now()
	r.idleBytesPerSec, r.churnBytesPerSec, r.churn = churn(b, w, s, &received)
	r.cpu = float64(framework.CPUTime(p.Cmd.Process.Pid)-cpu0) / float64(time.Since(at0))
	peakBy("the churn")
	r.rssPeak = framework.StatusKiB(p.Cmd.Process.Pid, "VmHWM")
	if relay.p != nil {
		body, _ := get(peer, "http://127.0.0.1:10294/metrics")
		sent, _ := metric(body, `netplane_relay_sent_bytes_total{request="watch"}`)
		b.Logf("the relay: %d MiB resident, %d MiB at its peak; %.0f bytes sent to the node role's watch in all; %.1f MB received from the API server",
			framework.StatusKiB(relay.p.Cmd.Process.Pid, "VmRSS")/1024, framework.StatusKiB(relay.p.Cmd.Process.Pid, "VmHWM")/1024, sent, float64(relay.received.Load())/1e6)
	}
	saveHeap(b, ns, "churned")
	if p.Exited() {
		b.Fatalf("node role exited:\n%s", p.Tail(30))
	}
	return r
}

func earlier(ts ...time.Time) time.Time {
	var out time.Time
	for _, t := range ts {
		if out.IsZero() || t.Before(out) {
			out = t
		}
	}
	return out
}

func later(ts ...time.Time) time.Time {
	var out time.Time
	for _, t := range ts {
		if t.After(out) {
			out = t
		}
	}
	return out
}

// overlaySynced waits until the overlay has every other Node, and returns
// the time of its last sync then (its metric's value).
func overlaySynced(b *testing.B, ns *netns.NS, p *framework.Process, remote int) time.Time {
	var at time.Time
	err := framework.Poll(benchCtx(b), 50*time.Millisecond, 20*time.Minute, "the overlay with every other Node", func(context.Context) error {
		body, err := get(ns, "http://"+metricsAddr+"/metrics")
		if err != nil {
			return err
		}
		if n, _ := metric(body, "netplane_overlay_remote_nodes"); int(n) != remote {
			return fmt.Errorf("%v remote nodes", n)
		}
		v, _ := metric(body, `netplane_node_last_sync_timestamp_seconds{feature="overlay"}`)
		at = time.Unix(0, int64(v*1e9))
		return nil
	})
	if err != nil {
		b.Fatalf("%v; log tail:\n%s", err, p.Tail(30))
	}
	return at
}

// waitReady waits for the node role's /readyz: the bridge is up, the CNI
// configuration written.
func waitReady(b *testing.B, ns *netns.NS, p *framework.Process) {
	err := framework.Poll(benchCtx(b), 50*time.Millisecond, 5*time.Minute, "the node role ready", func(context.Context) error {
		_, err := get(ns, "http://"+healthAddr+"/readyz")
		return err
	})
	if err != nil {
		b.Fatalf("%v; log tail:\n%s", err, p.Tail(30))
	}
}

// firstPackets times new connections from the client pod to the server pod,
// rounds alternating between the node's policy table and the same with an
// accept first in its forward chain. The server also listens on a port no
// policy allows: a connect there must fail, or the table is not enforcing.
func firstPackets(b *testing.B, node *netns.NS) (noneP50, noneP99, tableP50, tableP99 time.Duration) {
	srv, cli := podNS(b, node, "fsrv", serverIP), podNS(b, node, "fcli", clientIP)
	for _, port := range []string{"8080", "9999"} {
		l, err := srv.Listen(net.JoinHostPort(serverIP, port))
		if err != nil {
			b.Fatal(err)
		}
		framework.Serve(b, l, func(net.Conn) {})
	}
	if _, err := cli.Connects(serverIP+":9999", 1); err == nil {
		b.Fatal("the client reached the server on a port no policy allows: the policy table is not enforcing")
	}
	// The table rounds put the same rule in a chain of a table of their
	// own that no packet enters: every round follows and precedes the same
	// two runs of nft, which slow the connects after them (as in the
	// policy package's BenchmarkKernelConnectAtScale).
	node.MustExec(b, "nft", "add", "table", "inet", "bench-idle")
	node.MustExec(b, "nft", "add", "chain", "inet", "bench-idle", "idle")
	var none, table []time.Duration
	for round := range packetRounds {
		bypass := round%4 == 0 || round%4 == 3
		at, into := []string{"bench-idle", "idle"}, &table
		if bypass {
			at, into = []string{"netplane-policy", "forward"}, &none
		}
		out := node.MustExec(b, "nft", "-ae", "insert", "rule", "inet", at[0], at[1], "accept")
		_, h, _ := strings.Cut(out, "# handle ")
		d, err := cli.Connects(serverIP+":8080", connectsPer)
		if err != nil {
			b.Fatalf("client to server: %v", err)
		}
		*into = append(*into, d...)
		node.MustExec(b, "nft", "delete", "rule", "inet", at[0], at[1], "handle", strings.TrimSpace(h))
	}
	noneP50, noneP99 = percentiles(none)
	tableP50, tableP99 = percentiles(table)
	return
}

// endpointChanges moves the last endpoint of the first small Service to a
// new address, one change at a time, each timed until the kernel has it.
func endpointChanges(b *testing.B, w kubernetes.Interface, mon *nftwatch.Monitor, s Sizes) (p50, p99 time.Duration) {
	ctx := benchCtx(b)
	k := s.Big + s.Headless
	c := w.DiscoveryV1().EndpointSlices(s.ServiceNamespace(k))
	name := fmt.Sprintf("%s-0", s.ServiceName(k))
	var took []time.Duration
	for i := range changes {
		sl, err := c.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			b.Fatal(err)
		}
		ip := netip.AddrFrom4([4]byte{10, 200, byte(i), 1}).String()
		sl.Endpoints[len(sl.Endpoints)-1].Addresses = []string{ip}
		seen := mon.WatchAddr(ip)
		t0 := time.Now()
		if _, err := c.Update(ctx, sl, metav1.UpdateOptions{}); err != nil {
			b.Fatal(err)
		}
		took = append(took, waitSeen(b, seen, t0, "endpoint "+ip))
		time.Sleep(300 * time.Millisecond) // past the proxy's --min-sync-period
	}
	return percentiles(took)
}

// policyChanges adds to the policy that selects the server one more
// ingress rule from a new CIDR, one change at a time, each timed until the
// kernel has the prefix.
func policyChanges(b *testing.B, w kubernetes.Interface, mon *nftwatch.Monitor, s Sizes) (p50, p99 time.Duration) {
	ctx := benchCtx(b)
	c := w.NetworkingV1().NetworkPolicies(Namespace(0))
	var took []time.Duration
	for i := range changes {
		cur, err := c.Get(ctx, PolicyName(5), metav1.GetOptions{})
		if err != nil {
			b.Fatal(err)
		}
		next := WithBlock(s.Policy(0, 5), fmt.Sprintf("172.16.%d.0/24", i))
		next.ResourceVersion = cur.ResourceVersion
		seen := mon.WatchBytes(next.Name, []byte{172, 16, byte(i), 0})
		t0 := time.Now()
		if _, err := c.Update(ctx, next, metav1.UpdateOptions{}); err != nil {
			b.Fatal(err)
		}
		d := waitSeen(b, seen, t0, "policy block 172.16."+fmt.Sprint(i)+".0/24")
		if d > 100*time.Millisecond {
			b.Logf("policy change %d took %v (sent %s)", i, d.Round(time.Millisecond), t0.Format("15:04:05.000"))
		}
		took = append(took, d)
		time.Sleep(100 * time.Millisecond)
	}
	return percentiles(took)
}

func waitSeen(b *testing.B, seen <-chan time.Time, t0 time.Time, what string) time.Duration {
	select {
	case at := <-seen:
		return at.Sub(t0)
	case <-time.After(time.Minute):
		b.Fatalf("%s not in the kernel after a minute", what)
		return 0
	}
}

// churn counts what the node role receives from the API server while
// nothing changes, then while pods change at churnRate a second (a label
// on a random pod, several writes in flight).
func churn(b *testing.B, w kubernetes.Interface, s Sizes, received *atomic.Int64) (idle, busy, changed float64) {
	before := received.Load()
	time.Sleep(idleFor)
	idle = float64(received.Load()-before) / idleFor.Seconds()

	ctx := benchCtx(b)
	rng := rand.New(rand.NewPCG(1, 2))
	var done atomic.Int64
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	tick := time.NewTicker(time.Second / churnRate)
	defer tick.Stop()
	before = received.Load()
	t0 := time.Now()
	for i := 0; time.Since(t0) < churnFor; i++ {
		<-tick.C
		j := rng.IntN(s.Pods)
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := relabel(ctx, w, s.ServiceNamespace(s.serviceOf(j)), s.PodName(j), i); err == nil {
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	time.Sleep(time.Second) // the last changes' watch events still on their way
	elapsed := time.Since(t0)
	busy = float64(received.Load()-before) / elapsed.Seconds()
	return idle, busy, float64(done.Load()) / elapsed.Seconds()
}
