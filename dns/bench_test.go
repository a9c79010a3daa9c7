package dns

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/netplane/netplane/e2e/framework"
)

// BenchmarkAgainstCoreDNS compares netplane's DNS role with CoreDNS running
// kubeadm's default Corefile, both serving one API server holding 2,000
// Services and 5,000 Pods (NETPLANE_DNS_BENCH_SERVICES / _PODS change
// that), each pinned to the same single CPU with GOMAXPROCS=1 while dnsperf
// runs on the other. It reports QPS for cluster names and for a pod's
// search-path mix with the CPU time each server spent on them, p99 latency
// at a fixed load, resident memory, and the time from a Service create to
// its first answer; then netplane and CoreDNS (with and without its
// multisocket plugin) on both CPUs. Without bin/coredns (`make anchors`)
// only netplane's numbers are reported.
func BenchmarkAgainstCoreDNS(b *testing.B) {
	dnsperf := framework.RequireBinary(b, "dnsperf")
	framework.RequireBinary(b, "taskset")
	netplane := framework.RequireBinary(b, "netplane")
	coredns := framework.Binary("coredns")
	api := framework.StartAPIServer(b, framework.Options{})
	nSvc, nPods := envInt("NETPLANE_DNS_BENCH_SERVICES", 2000), envInt("NETPLANE_DNS_BENCH_PODS", 5000)
	start := time.Now()
	populate(b, api, nSvc, nPods)
	b.Logf("created %d Services and %d Pods in %v", nSvc, nPods, time.Since(start).Round(time.Second))

	up := startUpstream(b, nil) // every external name: NXDOMAIN, cached 60 s
	dir := b.TempDir()
	resolv := filepath.Join(dir, "resolv.conf")
	if err := os.WriteFile(resolv, nil, 0o644); err != nil {
		b.Fatal(err)
	}
	probe := fmt.Sprintf("svc-%d.ns-%d.svc.cluster.local.", nSvc-1, (nSvc-1)%benchNamespaces)
	if os.Getenv("NETPLANE_DNS_BENCH_MEMORY") != "" {
		memoryOnly(b, dnsperf, netplane, coredns, api, up.Addr, resolv, dir, probe, nSvc)
		return
	}
	// netplane as deployed by default (autopath, so it watches every pod),
	// the same with Go's default GOGC instead of the role's 25 (what the
	// GC setting costs and saves), and with kubeadm CoreDNS's feature set
	// (no autopath, no pod watch).
	servers := []*benchServer{
		startNetplane(b, "netplane", oneCPU, netplane, api, up.Addr, resolv, dir, nil),
		startNetplane(b, "netplane-gogc100", oneCPU, netplane, api, up.Addr, resolv, dir, []string{"GOGC=100"}),
		startNetplane(b, "netplane-noautopath", oneCPU, netplane, api, up.Addr, resolv, dir, nil, "--autopath=false"),
	}
	if coredns != "" {
		servers = append(servers, startCoreDNS(b, "coredns", oneCPU, coredns, api, up.Addr, dir, false))
	} else {
		b.Log("bin/coredns not built (make anchors): reporting netplane alone")
	}
	for _, s := range servers {
		waitAnswer(b, s, probe, 5*time.Minute)
	}
	cluster, mix := writeQueryFiles(b, dir, nSvc)
	for _, s := range servers {
		measureQPS(b, dnsperf, s, cluster, mix)
	}
	// p99 at the same fixed load for both: half the slower server's peak.
	load := servers[0].qpsCluster
	for _, s := range servers {
		load = min(load, s.qpsCluster)
	}
	for _, s := range servers {
		s.p99 = runDNSPerfP99(b, dnsperf, s, mix, int(load/2))
		s.rssMB, s.anonMB, s.fileMB = residentMB(b, s.proc)
		b.Logf("%s: p99 %v at %d QPS, RSS %.1f MB (anonymous %.1f, file %.1f)", s.name, s.p99, int(load/2), s.rssMB, s.anonMB, s.fileMB)
	}
	createToAnswer(b, api.Client, servers)
	report(b, servers)
	twoCPUs(b, dnsperf, netplane, coredns, api, up.Addr, resolv, dir, probe, cluster, mix, servers)
}

// twoCPUs measures netplane, and CoreDNS with and without its multisocket
// plugin, on both CPUs with GOMAXPROCS=2; dnsperf shares those CPUs, as
// the machine has no third, so each server's CPU time is reported beside
// its QPS. Each server of the one-CPU runs is stopped first.
func twoCPUs(b *testing.B, dnsperf, netplane, coredns string, api *framework.APIServer, upstream, resolv, dir, probe, cluster, mix string, one []*benchServer) {
	for _, s := range one {
		s.proc.Stop(5 * time.Second)
	}
	servers := []*benchServer{startNetplane(b, "netplane-2cpu", twoCPU, netplane, api, upstream, resolv, dir, nil)}
	if coredns != "" {
		servers = append(servers, startCoreDNS(b, "coredns-2cpu", twoCPU, coredns, api, upstream, dir, false),
			startCoreDNS(b, "coredns-multisocket-2cpu", twoCPU, coredns, api, upstream, dir, true))
	}
	for _, s := range servers {
		waitAnswer(b, s, probe, 5*time.Minute)
		measureQPS(b, dnsperf, s, cluster, mix)
		s.proc.Stop(5 * time.Second)
	}
	base := one[0]
	for _, s := range servers {
		b.Logf("%s: cluster QPS %.0f (×%.2f netplane on one CPU), search-mix QPS %.0f (×%.2f); CPU %.0f%% / %.0f%%",
			s.name, s.qpsCluster, s.qpsCluster/base.qpsCluster, s.qpsMix, s.qpsMix/base.qpsMix, s.cpuCluster, s.cpuMix)
		b.ReportMetric(s.qpsCluster, s.name+"-cluster-qps")
		b.ReportMetric(s.qpsMix, s.name+"-mix-qps")
	}
}

// measureQPS runs both query files against s at full speed, with the CPU
// time s spent meanwhile.
func measureQPS(b *testing.B, dnsperf string, s *benchServer, cluster, mix string) {
	cpu0 := framework.CPUTime(s.proc.Cmd.Process.Pid).Seconds()
	s.qpsCluster = runDNSPerf(b, dnsperf, s, cluster)
	cpu1 := framework.CPUTime(s.proc.Cmd.Process.Pid).Seconds()
	s.qpsMix = runDNSPerf(b, dnsperf, s, mix)
	cpu2 := framework.CPUTime(s.proc.Cmd.Process.Pid).Seconds()
	s.cpuCluster, s.cpuMix = 100*(cpu1-cpu0)/dnsperfSeconds, 100*(cpu2-cpu1)/dnsperfSeconds
	b.Logf("%s: cluster QPS %.0f (CPU %.0f%%), search-mix QPS %.0f (CPU %.0f%%)", s.name, s.qpsCluster, s.cpuCluster, s.qpsMix, s.cpuMix)
}

const benchNamespaces = 100

type benchServer struct {
	name                string
	addr                string
	cpus                cpuSet
	proc                *framework.Process
	qpsCluster, qpsMix  float64
	cpuCluster, cpuMix  float64 // the server's CPU use meanwhile, percent of one CPU
	p99                 time.Duration
	rssMB, anonMB       float64
	fileMB              float64
	createToFirstAnswer time.Duration
	pprof               string // its pprof address, if it serves one
}

// perCPU is the queries answered per second of the server's CPU time, at
// qps with cpu percent of one CPU in use.
func (s *benchServer) perCPU(qps, cpu float64) float64 { return qps / max(cpu, 1) * 100 }

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// populate creates the namespaces, ClusterIP Services and running Pods,
// many at a time.
func populate(b *testing.B, api *framework.APIServer, nSvc, nPods int) {
	cfg := *api.RestConfig
	cfg.QPS, cfg.Burst = 5000, 10000
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	c := kubernetes.NewForConfigOrDie(&cfg)
	ctx := context.Background()
	for i := range benchNamespaces {
		if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("ns-%d", i)}}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	parallel(b, nSvc, func(i int) error {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("svc-%d", i), Namespace: fmt.Sprintf("ns-%d", i%benchNamespaces)},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{httpPort()}}}
		_, err := c.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) { // created by a try that timed out
			return nil
		}
		return err
	})
	parallel(b, nPods, func(i int) error {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pod-%d", i), Namespace: fmt.Sprintf("ns-%d", i%benchNamespaces)},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: fmt.Sprintf("10.%d.%d.%d", 128+i>>16, i>>8&255, i&255)}}}}
		return createPod(ctx, c, p)
	})
}

func parallel(b *testing.B, n int, f func(i int) error) {
	var wg sync.WaitGroup
	next := make(chan int)
	var once sync.Once
	var first error
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := retry(f, i); err != nil {
					once.Do(func() { first = err })
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	if first != nil {
		b.Fatal(first)
	}
}

// retry calls f(i) up to five times a second apart: an API server on a
// loaded machine times some of tens of thousands of writes out.
func retry(f func(i int) error, i int) error {
	var err error
	for range 5 {
		if err = f(i); err == nil {
			return nil
		}
		time.Sleep(time.Second)
	}
	return err
}

func freePort(b *testing.B) int {
	ports, err := framework.FreePorts(1)
	if err != nil {
		b.Fatal(err)
	}
	return ports[0]
}

// cpuSet is where a server runs, and dnsperf against it.
type cpuSet struct {
	server, dnsperf string // taskset lists
	procs           int    // the server's GOMAXPROCS, and dnsperf's threads
}

var (
	oneCPU = cpuSet{server: "1", dnsperf: "0", procs: 1}
	twoCPU = cpuSet{server: "0,1", dnsperf: "0,1", procs: 2}
)

// pinned runs a server on cpus with as many threads of Go code.
func pinned(b *testing.B, name, log string, cpus cpuSet, args ...string) *framework.Process {
	cmd := exec.Command("taskset", append([]string{"-c", cpus.server}, args...)...)
	cmd.Env = append(os.Environ(), "GOMAXPROCS="+strconv.Itoa(cpus.procs))
	p, err := framework.StartProcess(name, cmd, log)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if b.Failed() {
			b.Logf("%s log tail:\n%s", name, p.Tail(20))
		}
		p.Stop(5 * time.Second)
	})
	return p
}

// startNetplane runs the dns role with env added to its environment and
// extra flags.
func startNetplane(b *testing.B, name string, cpus cpuSet, bin string, api *framework.APIServer, upstream, resolv, dir string, env []string, extra ...string) *benchServer {
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(b))
	args := append(append([]string{"env"}, env...), bin, "--role=dns",
		"--kubeconfig="+api.Kubeconfig, "--dns-bind-address="+addr, "--ttl=30", "--pod-records=insecure",
		"--upstream-servers="+upstream, "--resolv-conf="+resolv,
		"--health-bind-address=127.0.0.1:0", "--metrics-bind-address=127.0.0.1:0")
	args = append(args, extra...)
	p := pinned(b, name, filepath.Join(dir, name+".log"), cpus, args...)
	return &benchServer{name: name, addr: addr, cpus: cpus, proc: p}
}

// startCoreDNS runs kubeadm's default Corefile (cmd/kubeadm/app/phases/addons/dns),
// with the multisocket plugin (one socket per GOMAXPROCS) when asked.
func startCoreDNS(b *testing.B, name string, cpus cpuSet, bin string, api *framework.APIServer, upstream, dir string, multisocket bool) *benchServer {
	port := freePort(b)
	extra := ""
	if multisocket {
		extra = "\n    multisocket"
	}
	corefile := fmt.Sprintf(`.:%d {
    bind 127.0.0.1%s
    errors
    health 127.0.0.1:%d {
       lameduck 5s
    }
    ready 127.0.0.1:%d
    kubernetes cluster.local in-addr.arpa ip6.arpa {
       kubeconfig %s
       pods insecure
       fallthrough in-addr.arpa ip6.arpa
       ttl 30
    }
    prometheus 127.0.0.1:%d
    forward . %s {
       max_concurrent 1000
    }
    cache 30 {
       disable success cluster.local
       disable denial cluster.local
    }
    loop
    reload
    loadbalance
}
`, port, extra, freePort(b), freePort(b), api.Kubeconfig, freePort(b), upstream)
	path := filepath.Join(dir, name+".Corefile")
	if err := os.WriteFile(path, []byte(corefile), 0o644); err != nil {
		b.Fatal(err)
	}
	p := pinned(b, name, filepath.Join(dir, name+".log"), cpus, bin, "-conf", path)
	return &benchServer{name: name, addr: fmt.Sprintf("127.0.0.1:%d", port), cpus: cpus, proc: p}
}

func waitAnswer(b *testing.B, s *benchServer, name string, within time.Duration) time.Duration {
	start := time.Now()
	c := &dns.Client{Timeout: 200 * time.Millisecond}
	err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, within, true, func(context.Context) (bool, error) {
		m, _, err := c.Exchange(query(name, dns.TypeA), s.addr)
		if err == nil && m.Rcode == dns.RcodeSuccess && len(m.Answer) > 0 {
			return true, nil
		}
		if s.proc.Exited() {
			return false, fmt.Errorf("%s exited", s.name)
		}
		return false, nil
	})
	if err != nil {
		b.Fatalf("%s did not answer %s within %v (%v):\n%s", s.name, name, within, err, s.proc.Tail(20))
	}
	return time.Since(start)
}

// writeQueryFiles writes dnsperf inputs: cluster names only, and what pods
// with ndots:5 send: glibc asks A and AAAA for each step of the search
// path, so a pod typing "svc.ns" in namespace X sends svc.ns.X.svc.<zone>
// (NXDOMAIN) before svc.ns.svc.<zone>, and one typing an external name
// walks all three cluster suffixes (NXDOMAIN) before going upstream.
func writeQueryFiles(b *testing.B, dir string, nSvc int) (cluster, mix string) {
	r := rand.New(rand.NewPCG(1, 2))
	var cl, mx strings.Builder
	for range 20000 {
		i := r.IntN(nSvc)
		svc, ns := fmt.Sprintf("svc-%d", i), fmt.Sprintf("ns-%d", i%benchNamespaces)
		fmt.Fprintf(&cl, "%s.%s.svc.cluster.local A\n", svc, ns)
		from := fmt.Sprintf("ns-%d", r.IntN(benchNamespaces))
		var tries []string
		switch k := r.IntN(10); {
		case k < 4: // svc.ns
			tries = []string{svc + "." + ns + "." + from + ".svc.cluster.local", svc + "." + ns + ".svc.cluster.local"}
		case k < 7: // svc in its own namespace
			tries = []string{svc + "." + ns + ".svc.cluster.local"}
		default: // an external name
			ext := fmt.Sprintf("api%d.example.com", r.IntN(50))
			tries = []string{ext + "." + from + ".svc.cluster.local", ext + ".svc.cluster.local", ext + ".cluster.local", ext}
		}
		for _, t := range tries {
			fmt.Fprintf(&mx, "%s A\n%s AAAA\n", t, t)
		}
	}
	cluster, mix = filepath.Join(dir, "cluster.txt"), filepath.Join(dir, "mix.txt")
	for p, s := range map[string]string{cluster: cl.String(), mix: mx.String()} {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	return cluster, mix
}

var qpsLine = regexp.MustCompile(`Queries per second:\s+([0-9.]+)`)

// dnsperfSeconds is how long each dnsperf run sends.
const dnsperfSeconds = 10

func dnsperfArgs(dnsperf string, s *benchServer, file string) []string {
	host, port, _ := net.SplitHostPort(s.addr)
	return []string{"-c", s.cpus.dnsperf, dnsperf, "-s", host, "-p", port, "-d", file, "-l", strconv.Itoa(dnsperfSeconds),
		"-c", "20", "-T", strconv.Itoa(s.cpus.procs), "-q", "200", "-t", "2"}
}

// runDNSPerf runs dnsperf for 10 s at full speed and returns QPS.
func runDNSPerf(b *testing.B, dnsperf string, s *benchServer, file string) float64 {
	out, err := exec.Command("taskset", dnsperfArgs(dnsperf, s, file)...).CombinedOutput()
	m := qpsLine.FindSubmatch(out)
	if err != nil || m == nil {
		b.Fatalf("dnsperf: %v\n%s", err, out)
	}
	qps, _ := strconv.ParseFloat(string(m[1]), 64)
	return qps
}

// verboseLine is dnsperf -v's per-query report; the last field is the
// latency in seconds.
var verboseLine = regexp.MustCompile(`^> \S+ .* ([0-9]+\.[0-9]+)$`)

// runDNSPerfP99 runs dnsperf at qps and returns the 99th percentile latency.
// A run that reports no latency at all (it happens on a loaded machine) is
// tried once more.
func runDNSPerfP99(b *testing.B, dnsperf string, s *benchServer, file string, qps int) time.Duration {
	var lat []float64
	var err error
	for try := 0; try < 2 && len(lat) == 0; try++ {
		lat, err = dnsperfLatencies(dnsperf, s, file, qps)
	}
	if err != nil || len(lat) == 0 {
		b.Fatalf("dnsperf -v: %v, %d latencies", err, len(lat))
	}
	slices.Sort(lat)
	return time.Duration(lat[len(lat)*99/100] * float64(time.Second))
}

func dnsperfLatencies(dnsperf string, s *benchServer, file string, qps int) ([]float64, error) {
	args := append(dnsperfArgs(dnsperf, s, file), "-Q", strconv.Itoa(max(qps, 100)), "-v")
	cmd := exec.Command("taskset", args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	var lat []float64
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if m := verboseLine.FindStringSubmatch(sc.Text()); m != nil {
			v, _ := strconv.ParseFloat(m[1], 64)
			lat = append(lat, v)
		}
	}
	return lat, cmd.Wait()
}

// residentMB reads a process's resident memory: the total, and its
// anonymous (heap, stacks) and file-backed (the executable's pages) parts.
func residentMB(b *testing.B, p *framework.Process) (total, anon, file float64) {
	st, err := procStatusMB(p)
	if err != nil {
		b.Fatal(err)
	}
	return st["VmRSS:"], st["RssAnon:"], st["RssFile:"]
}

// procStatusMB reads the kB fields of /proc/PID/status, in MB.
func procStatusMB(p *framework.Process) (map[string]float64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.Cmd.Process.Pid))
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[2] == "kB" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			out[f[0]] = kb / 1024
		}
	}
	return out, nil
}

// createToAnswer creates Services and times, from the create returning, the
// first answer of each server; the median of five is kept.
func createToAnswer(b *testing.B, c kubernetes.Interface, servers []*benchServer) {
	times := make([][]time.Duration, len(servers))
	for i := range 5 {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns-0", Name: fmt.Sprintf("probe-%d", i)},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{httpPort()}}}
		if _, err := c.CoreV1().Services("ns-0").Create(context.Background(), svc, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		var wg sync.WaitGroup
		for j, s := range servers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				times[j] = append(times[j], waitAnswer(b, s, svc.Name+".ns-0.svc.cluster.local.", 30*time.Second))
			}()
		}
		wg.Wait()
	}
	for j, s := range servers {
		slices.Sort(times[j])
		s.createToFirstAnswer = times[j][len(times[j])/2]
	}
}

func report(b *testing.B, servers []*benchServer) {
	for _, s := range servers {
		b.Logf("%-8s cluster QPS %8.0f  search-mix QPS %8.0f  (per CPU-second %.0f, %.0f)  p99 %8v  RSS %6.1f MB (anonymous %.1f, file %.1f)  create→answer %v",
			s.name, s.qpsCluster, s.qpsMix, s.perCPU(s.qpsCluster, s.cpuCluster), s.perCPU(s.qpsMix, s.cpuMix),
			s.p99, s.rssMB, s.anonMB, s.fileMB, s.createToFirstAnswer)
		b.ReportMetric(s.qpsCluster, s.name+"-cluster-qps")
		b.ReportMetric(s.qpsMix, s.name+"-mix-qps")
		b.ReportMetric(float64(s.p99.Microseconds()), s.name+"-p99-µs")
		b.ReportMetric(s.rssMB, s.name+"-rss-MB")
	}
	c := servers[len(servers)-1]
	if c.name != "coredns" {
		return
	}
	for _, n := range servers[:len(servers)-1] {
		b.Logf("%s/coredns: cluster QPS ×%.2f, search-mix QPS ×%.2f (per CPU-second ×%.2f, ×%.2f), p99 ×%.2f, memory ×%.2f", n.name,
			n.qpsCluster/c.qpsCluster, n.qpsMix/c.qpsMix,
			n.perCPU(n.qpsCluster, n.cpuCluster)/c.perCPU(c.qpsCluster, c.cpuCluster), n.perCPU(n.qpsMix, n.cpuMix)/c.perCPU(c.qpsMix, c.cpuMix),
			float64(n.p99)/float64(c.p99), n.rssMB/c.rssMB)
		b.ReportMetric(n.qpsCluster/c.qpsCluster, n.name+"-cluster-qps-ratio")
		b.ReportMetric(n.qpsMix/c.qpsMix, n.name+"-mix-qps-ratio")
		b.ReportMetric(n.rssMB/c.rssMB, n.name+"-memory-ratio")
	}
}
