package policy

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
)

// BenchmarkPolicyAgainstKubeRouter compares netplane's node role with
// kube-router's firewall (v2.1.0, bin/kube-router from `make anchors`) and
// with no enforcer at all (the physical limit), against one API server
// holding NETPLANE_BENCH_POLICY_PODS pods (default 10,000; see
// compare_kuberouter_objects_test.go) and, in turn, each scale of
// NETPLANE_BENCH_POLICIES policies (default "0,100,1000").
// NETPLANE_BENCH_ENFORCERS picks the contenders (default
// "none,netplane,kube-router"); NETPLANE_BENCH_LOGS, a folder, keeps
// their logs. Each enforcer
// runs on two nodes, made fresh for it at each scale (vsTopology); the
// order alternates between scales. At each scale it measures:
//
//   - full sync from start: on the server's node, from process start and
//     from the enforcer's caches-synced log line to its log line ending the
//     first full sync of its policy rules, and the first moment a probe
//     that must be denied is denied;
//   - first-packet latency: TCP connects between the client and server pods
//     (across the nodes, through the probe policies' allow rules when
//     there are policies), p50 and p99, in rounds alternating with the
//     open pods, which no policy selects;
//   - the throughput of one TCP stream between the same two pairs;
//   - VmHWM and VmRSS of both nodes' enforcer processes;
//   - at the largest scale, for netplane, connects and streams in the same
//     processes alternating between the scale's policies and none
//     (vsMeasureAlternating): the figures the first-packet and stream
//     bounds are judged on.
//
// The server's node's enforcer starts first and alone, the client's once
// the first has synced: on this machine of 2 CPUs a second enforcer would
// take CPU that a real node does not share.
//
// At the largest scale, after the above, the time from an API write to the
// kernel for samples of each change kind (vsChanges): from the write's
// start until a connect attempt the change allows first succeeds, on the
// server's node, each written when the enforcer is idle. The client's
// node's enforcer is stopped first, for the same reason (its rules stay;
// every flip depends only on the server's node). netplane takes
// NETPLANE_BENCH_POLICY_SAMPLES samples of each kind (default 20);
// kube-router, whose every change is a full sync of about a minute at
// 1,000 policies × 10,000 pods, NETPLANE_BENCH_KUBEROUTER_SAMPLES (default
// 1, to keep the default run near a quarter of an hour). For netplane also the
// nftables notification of the commit that first touched its table after
// the write; kube-router has none to time: most of its change lands in
// ipsets, which the nftables monitor does not see, and each of its syncs
// rewrites its whole filter table, so no notification marks the change.
func BenchmarkPolicyAgainstKubeRouter(b *testing.B) {
	framework.RequireRoot(b)
	enforcers := vsEnforcers(b)
	pods := vsEnv("NETPLANE_BENCH_POLICY_PODS", 10000)
	scales := vsScales(pods)
	api := framework.StartAPIServer(b, framework.Options{ServiceCIDRs: "10.96.0.0/16"})
	c := newVSCluster(b, api)
	start := time.Now()
	c.populate(b, pods)
	b.Logf("%d pods in %d namespaces and the probe pods in the API server (created in %v); load %s",
		pods, pods/vsPodsPerNS, time.Since(start).Round(time.Millisecond), framework.LoadAverage())
	var base map[string]*vsResult // at scale 0
	for i, n := range scales {
		c.setPolicies(b, n)
		b.Logf("%d policies (and %d probe policies); load %s", n, map[bool]int{true: len(vsProbePolicies())}[n > 0], framework.LoadAverage())
		order := slices.Clone(enforcers)
		if i%2 == 1 {
			slices.Reverse(order)
		}
		res := map[string]*vsResult{}
		for j, e := range order {
			changes := 0
			if n == scales[len(scales)-1] && n > 0 {
				changes = e.samples
			}
			res[e.name] = runVS(b, e, c, n, changes, fmt.Sprintf("p%d%d", i, j))
		}
		if n == 0 {
			base = res
		}
		reportVS(b, n, res, base)
	}
}

// vsEnforcers are the contenders of NETPLANE_BENCH_ENFORCERS (default
// "none,netplane,kube-router").
func vsEnforcers(b *testing.B) []vsEnforcer {
	spec := os.Getenv("NETPLANE_BENCH_ENFORCERS")
	if spec == "" {
		spec = "none,netplane,kube-router"
	}
	var out []vsEnforcer
	for _, name := range strings.Split(spec, ",") {
		switch strings.TrimSpace(name) {
		case "none":
			out = append(out, vsNone)
		case "netplane":
			samples := min(vsEnv("NETPLANE_BENCH_POLICY_SAMPLES", 20), vsMaxSamples)
			out = append(out, vsNetplane(framework.RequireBinary(b, "netplane"), samples))
		case "kube-router":
			framework.RequireBinary(b, "ipset")
			framework.RequireBinary(b, "iptables")
			samples := min(vsEnv("NETPLANE_BENCH_KUBEROUTER_SAMPLES", 1), vsMaxSamples)
			out = append(out, vsKubeRouter(framework.RequireBinary(b, "kube-router"), samples))
		default:
			b.Fatalf("NETPLANE_BENCH_ENFORCERS: unknown enforcer %q", name)
		}
	}
	return out
}

func vsEnv(key string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(key)); err == nil && n >= 0 {
		return n
	}
	return def
}

// vsScales reads NETPLANE_BENCH_POLICIES; a scale needs n/10 namespaces.
func vsScales(pods int) []int {
	spec := os.Getenv("NETPLANE_BENCH_POLICIES")
	if spec == "" {
		spec = "0,100,1000"
	}
	var out []int
	for _, f := range strings.Split(spec, ",") {
		if n, err := strconv.Atoi(strings.TrimSpace(f)); err == nil && n >= 0 && n/10 <= pods/vsPodsPerNS {
			out = append(out, n/10*10)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// vsPath is what one pod-to-pod path measured: the probe pair's connects
// and streams, and the open pair's, which no policy selects.
type vsPath struct {
	lat, latOpen   []time.Duration
	tput, tputOpen []float64 // bits per second
}

// vsResult is one enforcer's figures at one scale.
type vsResult struct {
	syncStart, syncCaches, syncProbe time.Duration // server's node; zero: not measured
	vsPath
	alt     [2]vsPath // without and with the scale's policies, alternating (vsMeasureAlternating)
	mem     [2]vsMemory
	changes map[string][]time.Duration // kind → prober times
	commits map[string][]time.Duration // kind → notification times (netplane)
	writes  map[string][]time.Duration // kind → the API writes' own round trips
}

var (
	vsClient     = netip.MustParseAddr(vsClientIP)
	vsOpenClient = netip.MustParseAddr(vsOpenClientIP)
)

func vsServerPort(port int) netip.AddrPort {
	return netip.AddrPortFrom(netip.MustParseAddr(vsServerIP), uint16(port))
}

var vsOpenServer = netip.AddrPortFrom(netip.MustParseAddr(vsOpenServerIP), vsAllowedPort)

// runVS measures e at scale n (changes: samples of each kind, 0 for none).
func runVS(b *testing.B, e vsEnforcer, c *vsCluster, n, changes int, label string) *vsResult {
	top := newVSTopology(b, label)
	defer top.close(b)
	r := &vsResult{changes: map[string][]time.Duration{}, commits: map[string][]time.Duration{}, writes: map[string][]time.Duration{}}
	var procs [2]*framework.Process
	if e.enforces() {
		t0 := time.Now()
		procs[1] = vsStart(b, e, c.api, top.node2, vsServerNode)
		if n > 0 {
			denied, err := vsFlip(top.client, vsClient, vsServerPort(vsDeniedPort), false, 10*time.Minute, procs[1])
			if err != nil {
				b.Fatalf("%s, %d policies: %v; log tail:\n%s", e.name, n, err, procs[1].Tail(20))
			}
			r.syncProbe = denied.Sub(t0)
		}
		vsWaitLog(b, e, procs[1], e.fullSynced, 10*time.Minute)
		synced, caches := e.fullSynced(procs[1].Log), e.cachesSynced(procs[1].Log)
		r.syncStart = synced.Sub(t0)
		if !caches.IsZero() {
			r.syncCaches = synced.Sub(caches)
		}
		vsWaitIdle(b, e, procs[1], time.Second, 10*time.Minute)
		procs[0] = vsStart(b, e, c.api, top.node1, vsClientNode)
		vsWaitLog(b, e, procs[0], e.fullSynced, 10*time.Minute)
		vsWaitIdle(b, e, procs[0], time.Second, 10*time.Minute)
	}
	if n > 0 {
		if _, err := vsFlip(top.client, vsClient, vsServerPort(vsAllowedPort), true, 10*time.Second, nil); err != nil {
			b.Fatalf("%s, %d policies: the allowed connection: %v", e.name, n, err)
		}
	}
	vsMeasurePath(b, top, &r.vsPath, 20, 5)
	if changes > 0 && e.alternates {
		vsMeasureAlternating(b, e, c, top, procs, n, r)
	}
	if changes > 0 {
		r.mem[0] = vsMemoryOf(procs[0])
		procs[0].Stop(10 * time.Second)
		vsMeasureChanges(b, e, c, top, procs[1], changes, r)
	}
	for k, p := range procs {
		if p == nil {
			continue
		}
		if !p.Exited() {
			r.mem[k] = vsMemoryOf(p)
			p.Stop(10 * time.Second)
		}
		if dir := os.Getenv("NETPLANE_BENCH_LOGS"); dir != "" {
			if data, err := os.ReadFile(p.Log); err == nil {
				_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-%d-node-%d.log", e.name, n, k+1)), data, 0o644)
			}
		}
	}
	if changes > 0 {
		vsUndoChanges(b, c, changes)
	}
	vsLogResult(b, e.name, n, r)
	return r
}

// vsMeasurePath measures connects (rounds of 100) and one-second streams
// on the probe pair and the open pair, in alternating rounds so that the
// machine's other load falls on both alike.
func vsMeasurePath(b *testing.B, top *vsTopology, r *vsPath, connectRounds, streamRounds int) {
	for range connectRounds {
		for _, open := range []bool{false, true} {
			ns, src, dst, into := top.client, vsClient, vsServerPort(vsAllowedPort), &r.lat
			if open {
				ns, src, dst, into = top.openCl, vsOpenClient, vsOpenServer, &r.latOpen
			}
			d, err := vsConnectTimes(ns, src, dst, 100, time.Second)
			if err != nil {
				b.Fatal(err)
			}
			*into = append(*into, d...)
		}
	}
	for range streamRounds {
		for _, open := range []bool{false, true} {
			ns, src, dst, into := top.client, vsClient, vsServerPort(vsAllowedPort), &r.tput
			if open {
				ns, src, dst, into = top.openCl, vsOpenClient, vsOpenServer, &r.tputOpen
			}
			bps, err := vsStream(ns, src, dst, time.Second, top.streams)
			if err != nil {
				b.Fatal(err)
			}
			*into = append(*into, bps)
		}
	}
}

// vsMeasureChanges writes the samples, the kinds in turn, each when the
// enforcer is idle, and times each from the write to the flip.
func vsMeasureChanges(b *testing.B, e vsEnforcer, c *vsCluster, top *vsTopology, p *framework.Process, samples int, r *vsResult) {
	var mon *vsCommits
	if e.commitTable != "" {
		var err error
		if mon, err = newVSCommits(top.node2, e.commitTable); err != nil {
			b.Fatal(err)
		}
		defer mon.close()
	}
	for i := range samples {
		for _, ch := range vsChanges {
			src, dst := netip.MustParseAddr(ch.src(i)), vsServerPort(ch.port(i))
			if ch.prepare != nil {
				if err := vsCall(func(ctx context.Context) error { return ch.prepare(ctx, c, i) }); err != nil {
					b.Fatalf("%s sample %d, preparing: %v", ch.kind, i, err)
				}
			}
			vsWaitIdle(b, e, p, 300*time.Millisecond, 10*time.Minute)
			if vsAllowed(top.client, src, dst) {
				b.Fatalf("%s sample %d: %s → %s is allowed before the change", ch.kind, i, src, dst)
			}
			t0 := time.Now()
			if err := vsCall(func(ctx context.Context) error { return ch.write(ctx, c, i) }); err != nil {
				b.Fatalf("%s sample %d: %v", ch.kind, i, err)
			}
			r.writes[ch.kind] = append(r.writes[ch.kind], time.Since(t0))
			at, err := vsFlip(top.client, src, dst, true, 10*time.Minute, p)
			if err != nil {
				b.Fatalf("%s: %s sample %d: %v; log tail:\n%s", e.name, ch.kind, i, err, p.Tail(20))
			}
			r.changes[ch.kind] = append(r.changes[ch.kind], at.Sub(t0))
			if mon != nil {
				if commit, ok := mon.firstAfter(t0, 10*time.Second); ok {
					r.commits[ch.kind] = append(r.commits[ch.kind], commit.Sub(t0))
				}
			}
		}
	}
	if mon != nil && mon.lost > 0 {
		b.Logf("%s: the nftables monitor lost notifications %d times: commit times may be late", e.name, mon.lost)
	}
}

// vsCall is one API call, given a minute.
func vsCall(fn func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return fn(ctx)
}

// vsAllowed is one connect attempt: answered within vsAttemptLimit.
func vsAllowed(ns *netns.NS, src netip.Addr, dst netip.AddrPort) bool {
	_, err := vsConnectTimes(ns, src, dst, 1, vsAttemptLimit)
	return err == nil
}

// vsUndoChanges removes what the samples wrote, so the next enforcer
// starts from the same objects.
func vsUndoChanges(b *testing.B, c *vsCluster, samples int) {
	for _, ch := range vsChanges {
		vsParallel(b, samples, func(ctx context.Context, i int) error { return ch.undo(ctx, c, i) })
	}
}

// vsWaitLog waits until line finds its log line in p's log.
func vsWaitLog(b *testing.B, e vsEnforcer, p *framework.Process, line func(string) time.Time, limit time.Duration) {
	for deadline := time.Now().Add(limit); ; time.Sleep(20 * time.Millisecond) {
		if e.failed != nil {
			if l := e.failed(p.Log); l != "" {
				b.Fatalf("%s: a sync failed: %s", e.name, l)
			}
		}
		if !line(p.Log).IsZero() {
			return
		}
		if p.Exited() || time.Now().After(deadline) {
			b.Fatalf("%s: no full sync within %v (exited: %v); log tail:\n%s", e.name, limit, p.Exited(), p.Tail(30))
		}
	}
}

// vsWaitIdle waits until e on p is idle: no sync under way and its log
// quiet for quiet. Both log every sync; a change that came during a sync
// starts the next at once.
func vsWaitIdle(b *testing.B, e vsEnforcer, p *framework.Process, quiet, limit time.Duration) {
	size, since := int64(-1), time.Now()
	for deadline := time.Now().Add(limit); time.Now().Before(deadline); time.Sleep(quiet / 10) {
		st, err := os.Stat(p.Log)
		if err != nil {
			b.Fatal(err)
		}
		if st.Size() != size {
			size, since = st.Size(), time.Now()
			continue
		}
		if time.Since(since) >= quiet && (e.busy == nil || !e.busy(p.Log)) {
			return
		}
	}
	b.Logf("%s: its log still grows after %v", p.Name, limit)
}

func vsPercentile(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return percentile(d, p)
}

func vsMedian(f []float64) float64 {
	if len(f) == 0 {
		return 0
	}
	s := slices.Clone(f)
	slices.Sort(s)
	return s[len(s)/2]
}

func vsLogResult(b *testing.B, name string, n int, r *vsResult) {
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }
	line := fmt.Sprintf("%s, %d policies (load %s): connect p50 %v p99 %v (open pair %v, %v); stream %.2f Gbit/s (open pair %.2f)",
		name, n, framework.LoadAverage(), vsPercentile(r.lat, 50), vsPercentile(r.lat, 99), vsPercentile(r.latOpen, 50), vsPercentile(r.latOpen, 99),
		vsMedian(r.tput)/1e9, vsMedian(r.tputOpen)/1e9)
	if r.syncStart > 0 {
		line += fmt.Sprintf("; full sync %s from start, %s from caches synced", ms(r.syncStart), ms(r.syncCaches))
		if r.syncProbe > 0 {
			line += fmt.Sprintf(", probe denied after %s", ms(r.syncProbe))
		}
		line += fmt.Sprintf("; VmHWM/VmRSS node-1 %d/%d MiB, node-2 %d/%d MiB", r.mem[0].hwm/1024, r.mem[0].rss/1024, r.mem[1].hwm/1024, r.mem[1].rss/1024)
	}
	for _, ch := range vsChanges {
		if d := r.changes[ch.kind]; len(d) > 0 {
			line += fmt.Sprintf("; %s: %d samples, p50 %s p99 %s max %s", ch.kind, len(d), ms(vsPercentile(d, 50)), ms(vsPercentile(d, 99)), ms(slices.Max(d)))
			if cm := r.commits[ch.kind]; len(cm) > 0 {
				line += fmt.Sprintf(" (commit p50 %s p99 %s)", ms(vsPercentile(cm, 50)), ms(vsPercentile(cm, 99)))
			}
			w := r.writes[ch.kind]
			line += fmt.Sprintf(" (the write's own round trip p50 %s max %s)", ms(vsPercentile(w, 50)), ms(slices.Max(w)))
		}
	}
	b.Log(line)
}

// reportVS reports the figures of one scale: each enforcer's against its
// own at scale 0 (base, when measured), and netplane's against kube-router's.
func reportVS(b *testing.B, n int, res, base map[string]*vsResult) {
	pre := fmt.Sprintf("%d-", n)
	for name, r := range res {
		b.ReportMetric(float64(vsPercentile(r.lat, 50).Microseconds()), pre+name+"-connect-p50-µs")
		b.ReportMetric(float64(vsPercentile(r.lat, 99).Microseconds()), pre+name+"-connect-p99-µs")
		b.ReportMetric(vsMedian(r.tput)/1e9, pre+name+"-stream-Gbps")
		if off, on := r.alt[0], r.alt[1]; len(off.lat) > 0 && len(on.lat) > 0 {
			b.ReportMetric(vsPercentile(on.lat, 50).Seconds()/vsPercentile(off.lat, 50).Seconds(), pre+name+"-alternating-connect-p50-x")
			b.ReportMetric(vsPercentile(on.lat, 99).Seconds()/vsPercentile(off.lat, 99).Seconds(), pre+name+"-alternating-connect-p99-x")
			b.ReportMetric(vsMedian(on.tput)/vsMedian(off.tput), pre+name+"-alternating-stream-x")
		}
		if r.syncStart > 0 {
			b.ReportMetric(r.syncStart.Seconds(), pre+name+"-full-sync-s")
			b.ReportMetric(float64(r.mem[1].hwm)/1024, pre+name+"-VmHWM-MiB")
		}
		for _, ch := range vsChanges {
			if d := r.changes[ch.kind]; len(d) > 0 {
				b.ReportMetric(float64(vsPercentile(d, 99).Microseconds())/1000, pre+name+"-"+strings.ReplaceAll(ch.kind, " ", "-")+"-p99-ms")
			}
		}
	}
	np, kr := res["netplane"], res["kube-router"]
	if np == nil {
		return
	}
	ratio := func(a, b time.Duration) string {
		if b == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2fx", a.Seconds()/b.Seconds())
	}
	lines := []string{fmt.Sprintf("%d policies (load %s):", n, framework.LoadAverage())}
	for _, name := range []string{"netplane", "kube-router"} {
		r, b0 := res[name], base[name]
		if r == nil || b0 == nil || n == 0 {
			continue
		}
		lines = append(lines, fmt.Sprintf("  %s: connect p50 %v, p99 %v: %s and %s its figure with no policy (%v, %v; bound: at most 1.1x at 1,000); the open pair in the same run %v, %v",
			name, vsPercentile(r.lat, 50), vsPercentile(r.lat, 99), ratio(vsPercentile(r.lat, 50), vsPercentile(b0.lat, 50)), ratio(vsPercentile(r.lat, 99), vsPercentile(b0.lat, 99)),
			vsPercentile(b0.lat, 50), vsPercentile(b0.lat, 99), vsPercentile(r.latOpen, 50), vsPercentile(r.latOpen, 99)))
		lines = append(lines, fmt.Sprintf("  %s: stream %.2f Gbit/s: %.3fx the open pair in the same run, %.3fx its stream with no policy (bound: at least 0.95x)",
			name, vsMedian(r.tput)/1e9, vsMedian(r.tput)/vsMedian(r.tputOpen), vsMedian(r.tput)/vsMedian(b0.tput)))
		lines = append(lines, fmt.Sprintf("  %s: VmHWM/VmRSS on the server's node %d/%d MiB, with no policy %d/%d MiB",
			name, r.mem[1].hwm/1024, r.mem[1].rss/1024, b0.mem[1].hwm/1024, b0.mem[1].rss/1024))
	}
	for _, name := range []string{"netplane", "kube-router"} {
		if r := res[name]; r != nil {
			if l := vsAlternatingLine(name, n, r); l != "" {
				lines = append(lines, "  "+l)
			}
		}
	}
	if kr != nil {
		lines = append(lines, fmt.Sprintf("  full sync from start %v vs kube-router %v (%s), from caches synced %v vs %v (%s); VmHWM on the server's node %d vs %d MiB (%.2fx)",
			np.syncStart.Round(time.Millisecond), kr.syncStart.Round(time.Millisecond), ratio(np.syncStart, kr.syncStart),
			np.syncCaches.Round(time.Millisecond), kr.syncCaches.Round(time.Millisecond), ratio(np.syncCaches, kr.syncCaches),
			np.mem[1].hwm/1024, kr.mem[1].hwm/1024, float64(np.mem[1].hwm)/float64(max(kr.mem[1].hwm, 1))))
		for _, ch := range vsChanges {
			d, k := np.changes[ch.kind], kr.changes[ch.kind]
			if len(d) == 0 || len(k) == 0 {
				continue
			}
			lines = append(lines, fmt.Sprintf("  %s: p50 %v vs %v (%s), p99 %v vs %v (%s; bound: at most 100 ms and 0.1x)",
				ch.kind, vsPercentile(d, 50).Round(100*time.Microsecond), vsPercentile(k, 50).Round(time.Millisecond), ratio(vsPercentile(d, 50), vsPercentile(k, 50)),
				vsPercentile(d, 99).Round(100*time.Microsecond), vsPercentile(k, 99).Round(time.Millisecond), ratio(vsPercentile(d, 99), vsPercentile(k, 99))))
		}
	}
	b.Log(strings.Join(lines, "\n"))
}
