package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
	"github.com/netplane/netplane/e2e/nftwatch"
)

// BenchmarkProxyAgainstKubeProxy runs netplane's node role and kube-proxy
// (nftables mode, bin/kube-proxy from `make anchors`) one after the other,
// each in a fresh node namespace, against one API server and one set of
// objects, at each scale of NETPLANE_BENCH_SERVICES (comma-separated Service
// counts, default "10,1000"; add 10000 for the large run). Every Service has
// NETPLANE_BENCH_ENDPOINTS endpoints (default 10). A proxy whose full sync
// has not finished within NETPLANE_BENCH_SYNC_LIMIT (default 20m) is
// reported as such and left out of that scale's other measures. At each
// scale it measures, for both:
//
//   - full sync: from the process's own "lists received" log line (and from
//     process start) to the last Service answering: the last-created one
//     answering a TCP connect, and for netplane, which programs a big sync
//     in several transactions, the later log line of its first full sync,
//     with no nftables monitor listening yet (a listener makes the kernel
//     build a notification of every change, slowing both);
//   - peak RSS: VmHWM of the process; kube-proxy's `nft` children are not in
//     it, so the largest child's peak (wait4's ru_maxrss) is reported beside;
//   - first-packet latency: TCP connects through a ClusterIP, p50 and p99;
//   - one endpoint change (API write to the kernel's notification carrying
//     the new address), NETPLANE_BENCH_CHANGES times (default 1), and
//     unless NETPLANE_BENCH_NO_RESTART=1 a restart: time until the
//     first sync is done, and the monitor's count of transactions that
//     deleted something of an existing Service without adding it back, with
//     a prober connecting to a Service all along.
func BenchmarkProxyAgainstKubeProxy(b *testing.B) {
	framework.RequireRoot(b)
	kp := framework.RequireBinary(b, "kube-proxy")
	api := framework.StartAPIServer(b, framework.Options{})
	benchNode(b, api)
	objs := &benchObjects{api: api}
	proxies := []benchProxy{netplaneProxy(b), kubeProxy(kp)}
	for i, n := range benchScales() {
		start := time.Now()
		probe := objs.grow(b, n)
		b.Logf("%d Services × %d endpoints in the API server (created in %v); load %s", n, benchEndpointCount(), time.Since(start).Round(time.Millisecond), framework.LoadAverage())
		res := map[string]benchResult{}
		// Alternate who goes first, so neither always runs on a warmer machine.
		order := slices.Clone(proxies)
		if i%2 == 1 {
			slices.Reverse(order)
		}
		for j, px := range order {
			if os.Getenv("NETPLANE_BENCH_NETPLANE_ONLY") == "1" && px.name != "netplane" { // for profiling netplane
				continue
			}
			res[px.name] = runBenchProxy(b, px, objs, n, probe, fmt.Sprintf("10.250.%d.%d", i, j+1))
		}
		if len(res) == 2 && res["kube-proxy"].fromLists > 0 {
			reportBench(b, n, res["netplane"], res["kube-proxy"])
		}
	}
}

// benchEndpointCount reads NETPLANE_BENCH_ENDPOINTS.
func benchEndpointCount() int { return benchEnvInt("NETPLANE_BENCH_ENDPOINTS", 10) }

// benchSyncLimit reads NETPLANE_BENCH_SYNC_LIMIT.
func benchSyncLimit() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("NETPLANE_BENCH_SYNC_LIMIT")); err == nil && d > 0 {
		return d
	}
	return 20 * time.Minute
}

func benchEnvInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// benchChangesFrom is the smallest scale at which the endpoint change and
// the restart are measured.
var benchChangesFrom = 10

// benchScales reads NETPLANE_BENCH_SERVICES.
func benchScales() []int {
	spec := os.Getenv("NETPLANE_BENCH_SERVICES")
	if spec == "" {
		spec = "10,1000"
	}
	var out []int
	for _, f := range strings.Split(spec, ",") {
		if n, err := strconv.Atoi(strings.TrimSpace(f)); err == nil && n > 0 {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

func benchNode(b *testing.B, api *framework.APIServer) {
	ctx := framework.Ctx(b)
	node, err := api.Client.CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	node.Status.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "192.168.0.2"}}
	if _, err := api.Client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		b.Fatal(err)
	}
}

// benchProxy is one of the two proxies under test.
type benchProxy struct {
	name  string
	table string
	args  func(kubeconfig string) (bin string, args []string)
	// listsReceived is the log line's time at which the proxy had its
	// initial Service and EndpointSlice lists.
	listsReceived func(log string) time.Time
	// fullSynced, if set, is the log line's time at which the first full
	// sync had every Service programmed. netplane splits a big sync into
	// transactions, so the probe may answer before other Services do;
	// kube-proxy commits a family in one nft transaction, so its probe
	// answering is every Service answering.
	fullSynced func(log string) time.Time
	// synced is the metric that is non-zero once a sync has been done.
	synced string
}

// Both proxies serve metrics on their namespace's own loopback.
const benchMetricsAddr = "127.0.0.1:10249"

func netplaneProxy(b *testing.B) benchProxy {
	bin, tmp := netplaneBinary(b), b.TempDir()
	return benchProxy{
		name: "netplane", table: TableName,
		args: func(kc string) (string, []string) {
			return bin, []string{"--role=node", "--v=2", "--kubeconfig=" + kc, "--node-name=node-a", "--cluster-cidr=10.244.0.0/16",
				"--health-bind-address=127.0.0.1:0", "--metrics-bind-address=" + benchMetricsAddr,
				// As kube-proxy below: its health server, no conntrack sysctls.
				"--proxy-healthz-bind-address=127.0.0.1:10256",
				"--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0",
				"--cni-conf-dir=" + tmp, "--cni-bin-dir=" + tmp, "--ipam-state-dir=" + tmp, "--bridge=np-bench0"}
		},
		listsReceived: func(log string) time.Time { return lastLogTime(log, `"caches synced"`, `role="proxy"`) },
		fullSynced:    func(log string) time.Time { return firstLogTime(log, `"synced"`, `type="full"`) },
		synced:        `netplane_node_last_sync_timestamp_seconds{feature="proxy"}`,
	}
}

func kubeProxy(bin string) benchProxy {
	return benchProxy{
		name: "kube-proxy", table: "kube-proxy",
		args: func(kc string) (string, []string) {
			// --v=2 logs when the informer caches have synced.
			return bin, []string{"--proxy-mode=nftables", "--v=2", "--kubeconfig=" + kc, "--hostname-override=node-a", "--cluster-cidr=10.244.0.0/16",
				// Fixed ports on the namespace's own loopback (kube-proxy refuses port 0);
				// no conntrack sysctls: they are not the namespace's to set.
				"--healthz-bind-address=127.0.0.1:10256", "--metrics-bind-address=" + benchMetricsAddr,
				"--conntrack-max-per-core=0", "--conntrack-min=0",
				"--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0"}
		},
		listsReceived: func(log string) time.Time {
			return lastLogTime(log, "Caches are synced", "service config", "endpoint slice config")
		},
		synced: "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
	}
}

// lastLogTime is the time of the last klog line containing must and, when
// any are given, one of anyOf.
func lastLogTime(path, must string, anyOf ...string) time.Time {
	if len(anyOf) == 0 {
		t, _ := framework.LogLine(path, true, must)
		return t
	}
	var out time.Time
	for _, a := range anyOf {
		if t, _ := framework.LogLine(path, true, must, a); t.After(out) {
			out = t
		}
	}
	return out
}

// firstLogTime is the time of the first klog line containing all of must.
func firstLogTime(path string, must ...string) time.Time {
	t, _ := framework.LogLine(path, false, must...)
	return t
}

// benchResult is one proxy's numbers at one scale.
type benchResult struct {
	fromLists, fromStart                          time.Duration // full sync
	rssKiB, childKiB                              int
	treeKiB                                       int           // the process and its children at once, sampled
	p50, p99                                      time.Duration // first-packet latency
	change, changeP99                             time.Duration // zero: not measured
	restart                                       time.Duration
	restartKiB                                    int // peak RSS of the restarted process, adopting the table
	restartOrphans, restartDeletes, probeFailures int
	monitorOverflow                               int
}

// benchEndpointIPs are the addresses of the probe Services' endpoints, put
// on each node namespace's loopback with a listener on port 8080: a connect
// through the ClusterIP is answered locally.
var benchEndpointIPs = func() []string {
	var out []string
	for i := 1; i <= 10; i++ {
		out = append(out, fmt.Sprintf("10.255.0.%d", i))
	}
	return out
}()

func runBenchProxy(b *testing.B, px benchProxy, objs *benchObjects, n int, probe netip.AddrPort, newIP string) (r benchResult) {
	ns := benchNodeNS(b, px.name)
	kc := filepath.Join(b.TempDir(), "kubeconfig")
	fwd := ns.Forward(b, "127.0.0.1:0", strings.TrimPrefix(objs.api.URL, "https://"))
	if err := objs.api.WriteKubeconfig(kc, "https://"+fwd, objs.api.Token); err != nil {
		b.Fatal(err)
	}
	bin, args := px.args(kc)

	t0 := time.Now()
	p := ns.Start(b, bin, args...)
	tree := sampleTree(p.Cmd.Process.Pid)
	answered, err := waitAnswer(ns, probe, benchSyncLimit(), p)
	if err != nil && !p.Exited() {
		b.Logf("%s, %d Services: full sync not finished within %v (load %s); left out at this scale", px.name, n, benchSyncLimit(), framework.LoadAverage())
		p.Stop(10 * time.Second)
		return r
	}
	if err != nil {
		b.Fatalf("%s, %d Services: %v; log tail:\n%s", px.name, n, err, p.Tail(30))
	}
	lists := px.listsReceived(p.Log)
	if lists.IsZero() {
		b.Fatalf("%s: no lists-received line in its log:\n%s", px.name, p.Tail(30))
	}
	if px.fullSynced != nil {
		synced, err := waitLogTime(func() time.Time { return px.fullSynced(p.Log) }, time.Minute)
		if err != nil {
			b.Fatalf("%s: %v:\n%s", px.name, err, p.Tail(30))
		}
		answered = later(answered, synced)
	}
	r.fromStart, r.fromLists = answered.Sub(t0), answered.Sub(lists)
	// The monitor listens only from here on, and only until this run ends:
	// while anyone listens, in any namespace, the kernel builds a
	// notification of every change each commit makes, which would slow
	// both proxies' full syncs, and a monitor left from an earlier run
	// slowed whoever ran later (netplane's own monitor stays away from the
	// group while it commits; see nft/monitor.go).
	mon := nftwatch.New(b, ns)
	defer mon.Close()
	mark := mon.Mark()
	mon.Settle(mark, time.Second, 5*time.Minute)
	r.monitorOverflow = mon.Since(mark).Overflow

	lat, err := connectLatencies(ns, probe, 2000)
	if err != nil {
		b.Fatalf("%s: latency probe: %v", px.name, err)
	}
	r.p50, r.p99 = lat[len(lat)/2], lat[len(lat)*99/100]

	if n >= benchChangesFrom {
		// Both proxies rate-limit syncs (--min-sync-period: kube-proxy 1 s,
		// netplane 100 ms): let that pass, so the change measures the sync
		// and not the rate limit.
		var took []time.Duration
		for k := range min(benchEnvInt("NETPLANE_BENCH_CHANGES", 1), 50) {
			time.Sleep(2 * time.Second)
			// Each change a new address: 10.250.x.y, then 10.249.x.y, ...
			a := netip.MustParseAddr(newIP).As4()
			a[1] -= byte(k)
			ip := netip.AddrFrom4(a).String()
			seen := mon.WatchAddr(ip)
			t1 := time.Now()
			objs.changeLastEndpoint(b, ip)
			select {
			case at := <-seen:
				took = append(took, at.Sub(t1))
			case <-time.After(2 * time.Minute):
				b.Fatalf("%s: endpoint change to %s not in the kernel after 2m", px.name, ip)
			}
		}
		slices.Sort(took)
		r.change, r.changeP99 = took[len(took)/2], took[min(len(took)-1, len(took)*99/100)]
	}
	if dir := os.Getenv("NETPLANE_BENCH_LOGS"); dir != "" {
		if data, err := os.ReadFile(p.Log); err == nil {
			_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-%d.log", px.name, n)), data, 0o644)
		}
	}
	r.rssKiB, r.treeKiB = peakRSS(p.Cmd.Process.Pid), tree.Peak()
	p.Stop(10 * time.Second)
	r.childKiB = maxRSSWithChildren(p.Cmd)

	if n >= benchChangesFrom && os.Getenv("NETPLANE_BENCH_NO_RESTART") != "1" {
		r.restart, r.restartKiB, r.restartOrphans, r.restartDeletes, r.probeFailures = benchRestart(b, ns, mon, px, probe, kc)
	}
	b.Logf("%s, %d Services: full sync %v from lists, %v from start; peak RSS %d MiB (with children %d MiB, at once %d MiB); connect p50 %v p99 %v; change %v; restart ready %v (peak RSS %d MiB), orphan deletes %d, deletes %d, probe failures %d; monitor overflows %d",
		px.name, n, r.fromLists.Round(time.Millisecond), r.fromStart.Round(time.Millisecond),
		r.rssKiB/1024, r.childKiB/1024, r.treeKiB/1024, r.p50, r.p99, r.change.Round(time.Millisecond), r.restart.Round(time.Millisecond), r.restartKiB/1024,
		r.restartOrphans, r.restartDeletes, r.probeFailures, r.monitorOverflow)
	return r
}

// benchRestart starts the proxy again over the table its predecessor left,
// with a prober connecting through a ClusterIP all along, and returns the
// time until its first sync is done and what the monitor saw.
func benchRestart(b *testing.B, ns *netns.NS, mon *nftwatch.Monitor, px benchProxy, probe netip.AddrPort, kc string) (ready time.Duration, rssKiB, orphans, deletes, failures int) {
	var fails atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			if _, err := connectLatencies(ns, probe, 1); err != nil {
				fails.Add(1)
			}
		}
	}()
	mark := mon.Mark()
	bin, args := px.args(kc)
	t0 := time.Now()
	p := ns.Start(b, bin, args...)
	defer p.Stop(10 * time.Second)
	if err := waitMetric(ns, px.synced, 10*time.Minute, p); err != nil {
		b.Fatalf("%s restart: %v; log tail:\n%s", px.name, err, p.Tail(30))
	}
	ready = time.Since(t0)
	mon.Settle(mark, time.Second, 5*time.Minute)
	close(stop)
	wg.Wait()
	rssKiB = peakRSS(p.Cmd.Process.Pid)
	c := mon.Since(mark)
	if c.Overflow > 0 {
		b.Logf("%s restart: the monitor lost notifications (%d overflows): deletion counts are a lower bound", px.name, c.Overflow)
	}
	return ready, rssKiB, c.Orphans, c.Deletes, int(fails.Load())
}

func reportBench(b *testing.B, n int, np, kube benchResult) {
	ratio := func(k, m time.Duration) float64 { return k.Seconds() / m.Seconds() }
	pre := fmt.Sprintf("%d-", n)
	b.ReportMetric(np.fromLists.Seconds(), pre+"netplane-full-sync-s")
	b.ReportMetric(kube.fromLists.Seconds(), pre+"kube-proxy-full-sync-s")
	b.ReportMetric(float64(np.rssKiB)/1024, pre+"netplane-peak-MiB")
	b.ReportMetric(float64(kube.rssKiB)/1024, pre+"kube-proxy-peak-MiB")
	b.ReportMetric(float64(np.p99.Microseconds()), pre+"netplane-connect-p99-µs")
	b.ReportMetric(float64(kube.p99.Microseconds()), pre+"kube-proxy-connect-p99-µs")
	b.ReportMetric(float64(np.treeKiB)/1024, pre+"netplane-tree-peak-MiB")
	b.ReportMetric(float64(kube.treeKiB)/1024, pre+"kube-proxy-tree-peak-MiB")
	line := fmt.Sprintf("%d Services (load %s): full sync from lists %v vs %v (%.1fx faster), from start %v vs %v; peak RSS %d vs %d MiB (%.2fx; kube-proxy's largest nft child included: %d MiB); with children at once (sampled) %d vs %d MiB (%.2fx); connect p50 %v vs %v, p99 %v vs %v",
		n, framework.LoadAverage(), np.fromLists.Round(time.Millisecond), kube.fromLists.Round(time.Millisecond), ratio(kube.fromLists, np.fromLists),
		np.fromStart.Round(time.Millisecond), kube.fromStart.Round(time.Millisecond),
		np.rssKiB/1024, kube.rssKiB/1024, float64(np.rssKiB)/float64(kube.rssKiB), kube.childKiB/1024,
		np.treeKiB/1024, kube.treeKiB/1024, float64(np.treeKiB)/float64(kube.treeKiB),
		np.p50, kube.p50, np.p99, kube.p99)
	if np.change > 0 {
		b.ReportMetric(np.change.Seconds(), pre+"netplane-change-s")
		b.ReportMetric(kube.change.Seconds(), pre+"kube-proxy-change-s")
		b.ReportMetric(np.restart.Seconds(), pre+"netplane-restart-s")
		b.ReportMetric(kube.restart.Seconds(), pre+"kube-proxy-restart-s")
		line += fmt.Sprintf("; one endpoint change p50 %v vs %v (%.1fx faster), p99 %v vs %v; restart ready %v vs %v (peak RSS %d vs %d MiB), transactions that only deleted %d vs %d, failed probes %d vs %d",
			np.change.Round(time.Millisecond), kube.change.Round(time.Millisecond), ratio(kube.change, np.change),
			np.changeP99.Round(time.Millisecond), kube.changeP99.Round(time.Millisecond),
			np.restart.Round(time.Millisecond), kube.restart.Round(time.Millisecond), np.restartKiB/1024, kube.restartKiB/1024, np.restartOrphans, kube.restartOrphans, np.probeFailures, kube.probeFailures)
	}
	b.Log(line)
}

// benchNodeNS is a node namespace like the lab's: eth0 192.168.0.2/24 with
// a default route, and the probe endpoints on loopback with a listener.
func benchNodeNS(b *testing.B, name string) *netns.NS {
	ns, peer := netns.New(b, name), netns.New(b, name+"-peer")
	netns.Veth(b, ns, "eth0", peer, "eth0")
	// The peer refuses connections to every Service address at once: until
	// a proxy has a Service's rules, a probe fails fast instead of timing out.
	peer.MustExec(b, "ip", "addr", "add", "192.168.0.1/24", "dev", "eth0")
	peer.MustExec(b, "ip", "route", "add", "local", "10.96.0.0/16", "dev", "lo")
	ns.MustExec(b, "ip", "addr", "add", "192.168.0.2/24", "dev", "eth0")
	ns.MustExec(b, "ip", "route", "add", "default", "via", "192.168.0.1")
	for _, ip := range benchEndpointIPs {
		ns.MustExec(b, "ip", "addr", "add", ip+"/32", "dev", "lo")
	}
	l, err := ns.Listen("0.0.0.0:8080")
	if err != nil {
		b.Fatal(err)
	}
	framework.Serve(b, l, func(net.Conn) {})
	return ns
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// waitLogTime polls get until it finds its log line.
func waitLogTime(get func() time.Time, limit time.Duration) (time.Time, error) {
	var t time.Time
	err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, limit, true, func(context.Context) (bool, error) {
		t = get()
		return !t.IsZero(), nil
	})
	if err != nil {
		return time.Time{}, fmt.Errorf("no full-sync-done line in the log within %v", limit)
	}
	return t, nil
}

// waitAnswer returns when a TCP connect to addr from inside ns first
// succeeds. Connects are started without waiting, each from a port of its
// own, every millisecond at first and every half percent of the time waited
// later: one started before the rules existed sends its SYN nowhere, and a
// prober waiting for it (it used to, with a 20 ms timeout and 10 ms pauses)
// noticed the rules up to 30 ms late, half of a whole sync at 1,000
// Services. Attempts unanswered after 100 ms are dropped.
func waitAnswer(ns *netns.NS, addr netip.AddrPort, limit time.Duration, p *framework.Process) (time.Time, error) {
	var answered time.Time
	sa := &unix.SockaddrInet4{Port: int(addr.Port()), Addr: addr.Addr().As4()}
	err := ns.Do(func() error {
		type attempt struct {
			fd    int
			start time.Time
		}
		var open []attempt
		defer func() {
			for _, a := range open {
				unix.Close(a.fd)
			}
		}()
		start := time.Now()
		next := start
		for now := start; now.Sub(start) < limit; now = time.Now() {
			if p.Exited() {
				return fmt.Errorf("%s exited", p.Name)
			}
			if !now.Before(next) {
				next = now.Add(max(time.Millisecond, now.Sub(start)/200))
				fd, err := probeSocket(unix.SOCK_NONBLOCK)
				if err != nil {
					return err
				}
				switch err := unix.Connect(fd, sa); {
				case err == nil:
					unix.Close(fd)
					answered = time.Now()
					return nil
				case errors.Is(err, unix.EINPROGRESS):
					open = append(open, attempt{fd, now})
				default:
					unix.Close(fd) // refused or unreachable: try again
				}
			}
			fds := make([]int, len(open))
			for i, a := range open {
				fds[i] = a.fd
			}
			finished, ok, err := framework.PollConnects(fds, time.Millisecond)
			if err != nil {
				return err
			}
			now = time.Now()
			keep := open[:0]
			for i, a := range open {
				if finished[i] {
					unix.Close(a.fd)
					if ok[i] {
						answered = now
						open = append(keep, open[i+1:]...)
						return nil
					}
					continue
				}
				if now.Sub(a.start) > 100*time.Millisecond {
					unix.Close(a.fd)
					continue
				}
				keep = append(keep, a)
			}
			open = keep
		}
		return fmt.Errorf("%v did not answer within %v", addr, limit)
	})
	return answered, err
}

// connectLatencies times count blocking TCP connects to addr from inside
// the namespace, one OS thread, no Go scheduler in between; each socket is
// reset on close so no TIME_WAIT piles up. The result is sorted.
func connectLatencies(ns *netns.NS, addr netip.AddrPort, count int) ([]time.Duration, error) {
	return connectLatenciesWithin(ns, addr, count, 200*time.Millisecond)
}

// connectLatenciesWithin is connectLatencies with a connect timeout.
func connectLatenciesWithin(ns *netns.NS, addr netip.AddrPort, count int, timeout time.Duration) ([]time.Duration, error) {
	out := make([]time.Duration, 0, count)
	sa := &unix.SockaddrInet4{Port: int(addr.Port()), Addr: addr.Addr().As4()}
	err := ns.Do(func() error {
		for range count {
			fd, err := probeSocket(0)
			if err != nil {
				return err
			}
			tv := unix.NsecToTimeval(timeout.Nanoseconds())
			_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv)
			t := time.Now()
			err = connect(fd, sa)
			d := time.Since(t)
			unix.Close(fd)
			if err != nil {
				return err
			}
			out = append(out, d)
		}
		return nil
	})
	slices.Sort(out)
	return out, err
}

// probeSocket is a TCP socket reset on close (no TIME_WAIT piles up) and
// bound to a source port of its own: a reused one could meet the conntrack
// entry of an attempt made before the rules existed (closed by the peer's
// reset, kept 10 s, never DNATed).
func probeSocket(flags int) (int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|flags, 0)
	if err != nil {
		return -1, err
	}
	_ = unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
	if err := bindProbePort(fd); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

var probePort atomic.Uint32

// bindProbePort binds fd to the next of ports 10000-29999, below the
// ephemeral range (32768 and up), where the proxy's own connections to the
// API server live; a port still taken is skipped.
func bindProbePort(fd int) error {
	var err error
	for range 100 {
		err = unix.Bind(fd, &unix.SockaddrInet4{Port: 10000 + int(probePort.Add(1)%20000)})
		if !errors.Is(err, unix.EADDRINUSE) {
			return err
		}
	}
	return err
}

// connect is a blocking connect that a signal (the Go runtime's) may
// interrupt: the handshake then goes on, and is waited for.
func connect(fd int, sa unix.Sockaddr) error {
	err := unix.Connect(fd, sa)
	if !errors.Is(err, unix.EINTR) {
		return err
	}
	return framework.WaitConnected(fd, time.Minute)
}

// metricSet reports whether metric is in a Prometheus text body with every
// series (kube-proxy has one per IP family) non-zero.
func metricSet(body, metric string) bool {
	found := false
	for _, line := range strings.Split(body, "\n") {
		f := strings.Fields(line)
		if len(f) != 2 || (f[0] != metric && !strings.HasPrefix(f[0], metric+"{")) {
			continue
		}
		if v, err := strconv.ParseFloat(f[1], 64); err != nil || v == 0 {
			return false
		}
		found = true
	}
	return found
}

// waitMetric polls the proxy's metrics until metric is non-zero.
func waitMetric(ns *netns.NS, metric string, limit time.Duration, p *framework.Process) error {
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{
		DialContext: func(_ context.Context, network, addr string) (net.Conn, error) { return ns.Dial(network, addr) },
	}}
	defer client.CloseIdleConnections()
	var last error
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, limit, true, func(context.Context) (bool, error) {
		_, body, err := framework.HTTPGet(client, "http://"+benchMetricsAddr+"/metrics")
		last = err
		if err == nil && metricSet(body, metric) {
			return true, nil
		}
		if p.Exited() {
			return false, fmt.Errorf("%s exited", p.Name)
		}
		return false, nil
	})
	if err != nil && p.Exited() {
		return err
	}
	if err != nil {
		return fmt.Errorf("%s never non-zero within %v (last error %v)", metric, limit, last)
	}
	return nil
}

// benchObjects is the one object set both proxies are measured against:
// svc0… with 10 unreachable endpoints each, and after them one probe
// Service per scale whose endpoints answer in every node namespace.
type benchObjects struct {
	api    *framework.APIServer
	writer kubernetes.Interface // a client for bulk creation, beyond the test client's 200 QPS
	plain  int                  // svc0 … svc<plain-1>
	probes int
}

// grow adds Services (32 writers at a time) until there are n in all, the
// last-created being a new probe Service, whose ClusterIP:80 it returns.
func (o *benchObjects) grow(b *testing.B, n int) netip.AddrPort {
	if o.writer == nil {
		cfg := rest.CopyConfig(o.api.RestConfig)
		cfg.QPS, cfg.Burst = 5000, 5000
		cfg.ContentType = "application/vnd.kubernetes.protobuf"
		var err error
		if o.writer, err = kubernetes.NewForConfig(cfg); err != nil {
			b.Fatal(err)
		}
	}
	want := n - o.probes - 1
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	errs := make(chan error, max(want-o.plain, 0))
	for i := o.plain; i < want; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			if _, err := o.create(ctx, fmt.Sprintf("svc%d", i), benchEndpoints(i, "")); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	o.plain = max(o.plain, want)
	s, err := o.create(framework.Ctx(b), fmt.Sprintf("probe%d", o.probes), benchEndpointIPs)
	if err != nil {
		b.Fatal(err)
	}
	o.probes++
	return netip.AddrPortFrom(netip.MustParseAddr(s.Spec.ClusterIP), 80)
}

func (o *benchObjects) create(ctx context.Context, name string, ips []string) (*v1.Service, error) {
	s := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: v1.ServiceSpec{Ports: []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: 80}}}}
	// A loaded machine times some writes out although they were made: try
	// again, and take an existing object as made.
	var out *v1.Service
	err := retry.OnError(retry.DefaultBackoff, func(err error) bool { return !apierrors.IsAlreadyExists(err) && !apierrors.IsInvalid(err) }, func() error {
		got, err := o.writer.CoreV1().Services("default").Create(ctx, s, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			got, err = o.writer.CoreV1().Services("default").Get(ctx, name, metav1.GetOptions{})
		}
		out = got
		return err
	})
	if err != nil {
		return nil, err
	}
	err = retry.OnError(retry.DefaultBackoff, func(err error) bool { return !apierrors.IsInvalid(err) }, func() error {
		_, err := o.writer.DiscoveryV1().EndpointSlices("default").Create(ctx, benchSlice(name, ips), metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return err
	})
	return out, err
}

// benchEndpoints are Service i's endpoint addresses, the last replaced
// by last when given.
func benchEndpoints(i int, last string) []string {
	var ips []string
	for j := range benchEndpointCount() {
		ips = append(ips, fmt.Sprintf("10.%d.%d.%d", 100+j, i/250, i%250+1))
	}
	if last != "" {
		ips[len(ips)-1] = last
	}
	return ips
}

func benchSlice(svc string, ips []string) *discovery.EndpointSlice {
	s := &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: svc + "-a", Labels: map[string]string{discovery.LabelServiceName: svc}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(v1.ProtocolTCP), Port: ptr.To[int32](8080)}},
	}
	for _, ip := range ips {
		s.Endpoints = append(s.Endpoints, discovery.Endpoint{Addresses: []string{ip}, NodeName: ptr.To("node-b"),
			Conditions: discovery.EndpointConditions{Ready: ptr.To(true)}})
	}
	return s
}

// changeLastEndpoint replaces the last endpoint of the last plain Service.
func (o *benchObjects) changeLastEndpoint(b *testing.B, ip string) {
	ctx := framework.Ctx(b)
	c := o.api.Client.DiscoveryV1().EndpointSlices("default")
	i := o.plain - 1
	old, err := c.Get(ctx, fmt.Sprintf("svc%d-a", i), metav1.GetOptions{})
	if err != nil {
		b.Fatal(err)
	}
	s := benchSlice(fmt.Sprintf("svc%d", i), benchEndpoints(i, ip))
	s.ResourceVersion = old.ResourceVersion
	if _, err := c.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		b.Fatal(err)
	}
}

// maxRSSWithChildren is wait4's ru_maxrss of an ended process: the peak of
// the process or of its largest waited-for descendant (kube-proxy's `nft`).
func maxRSSWithChildren(cmd *exec.Cmd) int {
	if cmd.ProcessState == nil {
		return 0
	}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		return int(ru.Maxrss)
	}
	return 0
}

// treeSampler samples the resident memory of a process and all its
// descendants together (kube-proxy runs nft as a child for every sync, and
// both are resident at once; a pod's memory limit covers both), every
// 10 ms, and keeps the largest sum.
type treeSampler struct {
	stop chan struct{}
	done chan int // the peak in KiB
}

func sampleTree(pid int) *treeSampler {
	ts := &treeSampler{stop: make(chan struct{}), done: make(chan int, 1)}
	go func() {
		peak := 0
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			peak = max(peak, treeRSS(pid))
			select {
			case <-ts.stop:
				ts.done <- peak
				return
			case <-t.C:
			}
		}
	}()
	return ts
}

// Peak stops sampling and returns the largest sum seen.
func (ts *treeSampler) Peak() int {
	close(ts.stop)
	return <-ts.done
}

// treeRSS is the VmRSS of pid and its descendants, in KiB.
func treeRSS(pid int) int {
	sum := framework.StatusKiB(pid, "VmRSS")
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	for _, task := range tasks {
		kids, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, task.Name()))
		for _, f := range strings.Fields(string(kids)) {
			if kid, err := strconv.Atoi(f); err == nil {
				sum += treeRSS(kid)
			}
		}
	}
	return sum
}

func peakRSS(pid int) int { return framework.StatusKiB(pid, "VmHWM") }
