package dns

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/netplane/netplane/e2e/framework"
)

var relistFull = flag.Bool("relist-full", false,
	"BenchmarkRelistMemory at Kubernetes' published limits: 150,000 pods, 10,000 Services in 10,000 namespaces")

var relistProfile = flag.String("relist-profile", "",
	"BenchmarkRelistMemory writes netplane's heap profiles into this directory: steady.pb.gz before the API server restart, peak.pb.gz when its anonymous memory was highest through the relist, relisted.pb.gz after it, each with its text (.txt); profiling reads parts of the executable and allocates, so the figures of a run without it are the ones to quote")

// relistSize is the cluster BenchmarkRelistMemory builds.
type relistSize struct{ pods, services int }

// headlessEvery makes one Service in so many headless, with
// headlessEndpoints ready endpoints in slices of at most 100, as the
// EndpointSlice controller packs them.
const (
	headlessEvery     = 40
	headlessEndpoints = 250
)

// BenchmarkRelistMemory measures the DNS role's resident memory through an
// API server restart, after which every reflector lists again, beside
// CoreDNS with kubeadm's Corefile in the same run, both on CPU 1. The
// cluster is 15,000 pods and 1,000 Services in as many namespaces, one
// Service in 40 headless with 250 ready endpoints; -relist-full (after
// -args) makes it Kubernetes' published limits, 150,000 pods and 10,000
// Services. Objects are written through the API server, without kubelets;
// pods carry a realistic spec (labels, an owner, a container with ports,
// environment, resources and a volume), since the list's size is what a
// relist costs. Steady is VmRSS once both answer and have run 10 s more;
// the peak is VmHWM, reset (clear_refs 5) just before kube-apiserver is
// killed and read once both answer a Service created after its restart
// and have run 10 s more. NETPLANE_DNS_BENCH_BEFORE names another netplane
// binary, run beside them as netplane-before through the same restart;
// NETPLANE_DNS_BENCH_NO_AUTOPATH=1 runs netplane beside them with
// --autopath=false as well, which follows no pods, as kubeadm's CoreDNS.
func BenchmarkRelistMemory(b *testing.B) {
	netplane := framework.RequireBinary(b, "netplane")
	framework.RequireBinary(b, "taskset")
	coredns := framework.Binary("coredns")
	size := relistSize{pods: 15000, services: 1000}
	if *relistFull {
		size = relistSize{pods: 150000, services: 10000}
	}
	api := framework.StartAPIServer(b, framework.Options{})
	start := time.Now()
	populateRelist(b, api, size)
	b.Logf("created %d Services (%d headless, %d endpoints each) in as many namespaces and %d pods in %v",
		size.services, size.services/headlessEvery, headlessEndpoints, size.pods, time.Since(start).Round(time.Second))

	up := startUpstream(b, nil)
	dir := b.TempDir()
	resolv := filepath.Join(dir, "resolv.conf")
	if err := os.WriteFile(resolv, nil, 0o644); err != nil {
		b.Fatal(err)
	}
	var pprof []string
	if *relistProfile != "" {
		pprof = []string{fmt.Sprintf("--pprof-bind-address=127.0.0.1:%d", freePort(b))}
	}
	servers := []*benchServer{startNetplane(b, "netplane", oneCPU, netplane, api, up.Addr, resolv, dir, nil, pprof...)}
	if before := os.Getenv("NETPLANE_DNS_BENCH_BEFORE"); before != "" { // an A/B through the same restart
		servers = append(servers, startNetplane(b, "netplane-before", oneCPU, before, api, up.Addr, resolv, dir, nil))
	}
	if os.Getenv("NETPLANE_DNS_BENCH_NO_AUTOPATH") != "" { // as kubeadm's CoreDNS, which follows no pods
		servers = append(servers, startNetplane(b, "netplane-no-autopath", oneCPU, netplane, api, up.Addr, resolv, dir, nil, "--autopath=false"))
	}
	if coredns != "" {
		servers = append(servers, startCoreDNS(b, "coredns", oneCPU, coredns, api, up.Addr, dir, false))
	}
	probe := fmt.Sprintf("svc-%d.ns-%d.svc.cluster.local.", size.services-1, size.services-1)
	for _, s := range servers {
		b.Logf("%s answered after %v", s.name, waitAnswer(b, s, probe, 15*time.Minute).Round(time.Second))
	}
	// A DNS server in a cluster is never idle: each gets a steady load, so
	// that what serving keeps resident (the executable's pages of the
	// query path among it) is in the steady state too.
	if dnsperf := framework.Binary("dnsperf"); dnsperf != "" {
		names := relistQueries(b, dir, size)
		for _, s := range servers {
			stop := backgroundLoad(b, dnsperf, s, names, relistLoadQPS)
			defer func() { b.Logf("%s under %d QPS through the run: %s", s.name, relistLoadQPS, stop()) }()
		}
	}
	time.Sleep(10 * time.Second) // a measurement window, not a wait for an event
	steady := make([]float64, len(servers))
	for i, s := range servers {
		var anon, file float64
		steady[i], anon, file = residentMB(b, s.proc)
		b.Logf("%s: steady %.1f MB (anonymous %.1f, file %.1f)", s.name, steady[i], anon, file)
		resetPeak(b, s.proc)
	}
	heapProfile(b, pprof, "steady.pb.gz")

	peaks := make([]*residentPeak, len(servers))
	for i, s := range servers {
		peaks[i] = samplePeak(s.proc)
	}
	stopProfiles := peakProfiles(b, pprof, servers[0].proc)
	restartAndRelist(b, api, servers)
	stopProfiles()
	time.Sleep(10 * time.Second) // the relist's garbage is collected in this window
	heapProfile(b, pprof, "relisted.pb.gz")
	for i, s := range servers {
		rss, anon, file := residentMB(b, s.proc)
		peak := statusMB(b, s.proc, "VmHWM:")
		pa, pf := peaks[i].stop()
		b.Logf("%s: steady %.1f MB, peak through the relist %.1f MB (×%.2f steady; sampled every 10 ms: anonymous %.1f, file %.1f), after it %.1f MB (anonymous %.1f, file %.1f)",
			s.name, steady[i], peak, peak/steady[i], pa, pf, rss, anon, file)
		b.ReportMetric(pa, s.name+"-peak-anon-MB")
		b.ReportMetric(steady[i], s.name+"-steady-MB")
		b.ReportMetric(peak, s.name+"-peak-MB")
		b.ReportMetric(peak/steady[i], s.name+"-peak/steady")
	}
	if c := servers[len(servers)-1]; c.name == "coredns" {
		for _, s := range servers[:len(servers)-1] {
			n, c := statusMB(b, s.proc, "VmHWM:"), statusMB(b, c.proc, "VmHWM:")
			b.Logf("%s's peak / CoreDNS's peak: ×%.2f", s.name, n/c)
			b.ReportMetric(n/c, s.name+"/coredns-peak")
		}
	}
}

// restartAndRelist kills kube-apiserver, starts it again and returns once
// every server has listed again: each answers a Service made after the
// restart, and netplane, whose pods list is the longest, a pod too.
func restartAndRelist(b *testing.B, api *framework.APIServer, servers []*benchServer) {
	api.KillAPIServer()
	restarted, err := api.RestartAPIServer(5 * time.Minute)
	if err != nil {
		b.Fatal(err)
	}
	after := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns-0", Name: "after-restart"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{httpPort()}}}
	if _, err := api.Client.CoreV1().Services("ns-0").Create(context.Background(), after, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	// A pod made now is in netplane's index once its pods are listed again
	// and applied: its address on loopback, autopath then answers a query
	// from it.
	if _, err := framework.CreatePod(context.Background(), api.Client, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns-0", Name: "after-restart"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "pause"}}},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: afterRestartPodIP}}}}); err != nil {
		b.Fatal(err)
	}
	for _, s := range servers {
		waitAnswer(b, s, "after-restart.ns-0.svc.cluster.local.", 15*time.Minute)
		b.Logf("%s answered a Service created after the restart %v after it", s.name, time.Since(restarted).Round(time.Second))
	}
	for _, s := range servers {
		if strings.HasPrefix(s.name, "netplane") && !strings.HasSuffix(s.name, "no-autopath") {
			waitAutopath(b, s, 15*time.Minute)
			b.Logf("%s answered the pod made after the restart %v after it", s.name, time.Since(restarted).Round(time.Second))
		}
	}
}

// heapProfile writes netplane's heap profile into -relist-profile's
// directory when its pprof flag is among args. Its allocations between two
// profiles (go tool pprof -sample_index=alloc_space -diff_base) are what a
// relist allocates.
func heapProfile(b *testing.B, args []string, file string) {
	if len(args) == 0 {
		return
	}
	addr := strings.TrimPrefix(args[0], "--pprof-bind-address=")
	// The profile, and beside it its text, which ends with the runtime's
	// memory statistics (heap in use, idle, released; stacks, metadata).
	for _, f := range []struct{ query, name string }{{"", file}, {"?debug=1", file + ".txt"}} {
		resp, err := http.Get("http://" + addr + "/debug/pprof/heap" + f.query)
		if err != nil {
			b.Fatal(err)
		}
		out, err := os.Create(filepath.Join(*relistProfile, f.name))
		if err != nil {
			b.Fatal(err)
		}
		_, err = io.Copy(out, resp.Body)
		resp.Body.Close()
		out.Close()
		if err != nil {
			b.Fatal(err)
		}
	}
}

// peakProfiles takes netplane's heap profile through the relist, every
// 200 ms, and keeps in peak.pb.gz (and its text) the one taken when its
// anonymous memory was highest: what was live then.
func peakProfiles(b *testing.B, args []string, p *framework.Process) (stop func()) {
	if len(args) == 0 {
		return func() {}
	}
	addr := strings.TrimPrefix(args[0], "--pprof-bind-address=")
	get := func(query string) []byte {
		resp, err := http.Get("http://" + addr + "/debug/pprof/heap" + query)
		if err != nil {
			return nil
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return body
	}
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		var most float64
		var prof, text []byte
		defer func() {
			_ = os.WriteFile(filepath.Join(*relistProfile, "peak.pb.gz"), prof, 0o644)
			_ = os.WriteFile(filepath.Join(*relistProfile, "peak.pb.gz.txt"), text, 0o644)
		}()
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			if st, err := procStatusMB(p); err == nil && st["RssAnon:"] > most {
				most, prof, text = st["RssAnon:"], get(""), get("?debug=1")
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() { close(done); <-stopped }
}

// afterRestartPodIP is the address of the pod made after the restart, on
// loopback so that the benchmark can ask from it.
const afterRestartPodIP = "127.0.9.9"

// waitAutopath waits until s answers from afterRestartPodIP with autopath:
// a query for svc-0.ns-0 in the pod's namespace gets the CNAME to
// svc-0.ns-0.svc.cluster.local.
func waitAutopath(b *testing.B, s *benchServer, within time.Duration) {
	c := &dns.Client{Timeout: 200 * time.Millisecond, Dialer: &net.Dialer{LocalAddr: &net.UDPAddr{IP: net.ParseIP(afterRestartPodIP)}}}
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, within, true, func(context.Context) (bool, error) {
		m, _, err := c.Exchange(query("svc-0.ns-0.ns-0.svc.cluster.local.", dns.TypeA), s.addr)
		return err == nil && len(m.Answer) > 0 && m.Answer[0].Header().Rrtype == dns.TypeCNAME, nil
	})
	if err != nil {
		b.Fatalf("%s never answered from the pod made after the restart: %v", s.name, err)
	}
}

// relistLoadQPS is the query load on each server through the run.
const relistLoadQPS = 1000

// relistQueries writes a dnsperf input of every Service's name.
func relistQueries(b *testing.B, dir string, size relistSize) string {
	var sb strings.Builder
	for i := range size.services {
		fmt.Fprintf(&sb, "svc-%d.ns-%d.svc.cluster.local A\n", i, i)
	}
	path := filepath.Join(dir, "relist-queries.txt")
	if err := os.WriteFile(path, []byte(sb.String()), 0o644); err != nil {
		b.Fatal(err)
	}
	return path
}

// backgroundLoad sends qps queries a second from file to s, from CPU 0,
// until stop, which returns dnsperf's count of queries sent and lost.
func backgroundLoad(b *testing.B, dnsperf string, s *benchServer, file string, qps int) (stop func() string) {
	args := append(dnsperfArgs(dnsperf, s, file), "-Q", strconv.Itoa(qps))
	args[slices.Index(args, "-l")+1] = "3600"
	cmd := exec.Command("taskset", args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	return func() string {
		_ = cmd.Process.Signal(os.Interrupt) // dnsperf prints its statistics and exits
		_ = cmd.Wait()
		var kept []string
		for _, line := range strings.Split(out.String(), "\n") {
			if strings.Contains(line, "Queries sent:") || strings.Contains(line, "Queries lost:") {
				kept = append(kept, strings.TrimSpace(line))
			}
		}
		return strings.Join(kept, ", ")
	}
}

// resetPeak sets a process's VmHWM back to its current VmRSS.
func resetPeak(b *testing.B, p *framework.Process) {
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", p.Cmd.Process.Pid), []byte("5"), 0); err != nil {
		b.Fatal(err)
	}
}

// statusMB reads one kB field of /proc/PID/status, in MB.
func statusMB(b *testing.B, p *framework.Process, field string) float64 {
	st, err := procStatusMB(p)
	if err != nil {
		b.Fatal(err)
	}
	return st[field]
}

// populateRelist writes the namespaces, Services, the headless Services'
// EndpointSlices and the pods, many at a time.
func populateRelist(b *testing.B, api *framework.APIServer, size relistSize) {
	cfg := *api.RestConfig
	cfg.QPS, cfg.Burst = 5000, 10000
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	c := kubernetes.NewForConfigOrDie(&cfg)
	ctx := context.Background()
	exists := func(err error) error {
		if apierrors.IsAlreadyExists(err) { // created by a try that timed out
			return nil
		}
		return err
	}
	parallel(b, size.services, func(i int) error {
		_, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("ns-%d", i)}}, metav1.CreateOptions{})
		return exists(err)
	})
	parallel(b, size.services, func(i int) error {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("svc-%d", i), Namespace: fmt.Sprintf("ns-%d", i)},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{httpPort()}, Selector: map[string]string{"app": fmt.Sprintf("app-%d", i)}}}
		if i%headlessEvery == 0 {
			svc.Spec.ClusterIP = corev1.ClusterIPNone
		}
		if _, err := c.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{}); exists(err) != nil {
			return err
		}
		if i%headlessEvery != 0 {
			return nil
		}
		for _, sl := range headlessSlices(svc, i) {
			if _, err := c.DiscoveryV1().EndpointSlices(sl.Namespace).Create(ctx, sl, metav1.CreateOptions{}); exists(err) != nil {
				return err
			}
		}
		return nil
	})
	parallel(b, size.pods, func(i int) error {
		_, err := framework.CreatePod(ctx, c, relistPod(i, size.services))
		return err
	})
}

// headlessSlices are the EndpointSlices of the i-th Service, headless;
// every endpoint has an address of its own, apart from the pods'.
func headlessSlices(svc *corev1.Service, i int) []*discoveryv1.EndpointSlice {
	var out []*discoveryv1.EndpointSlice
	for first := 0; first < headlessEndpoints; first += 100 {
		sl := slice(svc.Namespace, fmt.Sprintf("%s-%d", svc.Name, first/100), svc.Name, discoveryv1.AddressTypeIPv4, httpSlicePorts())
		for j := first; j < min(first+100, headlessEndpoints); j++ {
			sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{
				Addresses:  []string{fmt.Sprintf("10.%d.%d.%d", 200+i>>8, i&255, j)},
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
				Hostname:   ptr.To(fmt.Sprintf("web-%d", j)),
				NodeName:   ptr.To(fmt.Sprintf("node-%d", j%100)),
			})
		}
		out = append(out, sl)
	}
	return out
}

// relistPod is the i-th pod, in the namespace of one of nNS Services, with
// the spec a Deployment's pod typically has.
func relistPod(i, nNS int) *corev1.Pod {
	app := fmt.Sprintf("app-%d", i%nNS)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: fmt.Sprintf("%s-7d9f8c6b5-%05d", app, i), Namespace: fmt.Sprintf("ns-%d", i%nNS),
			Labels:      map[string]string{"app": app, "pod-template-hash": "7d9f8c6b5", "tier": "backend"},
			Annotations: map[string]string{"kubectl.kubernetes.io/restartedAt": "2026-11-30T10:00:00Z"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: app + "-7d9f8c6b5",
				UID: "0c6f7f3e-1b7a-4c39-9d2e-4f0a5b6c7d8e", Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}},
		},
		Spec: corev1.PodSpec{
			NodeName: fmt.Sprintf("node-%d", i%5000),
			Containers: []corev1.Container{{
				Name: "app", Image: "registry.example.com/team/" + app + ":v1.42.3",
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}, {Name: "metrics", ContainerPort: 9090}},
				Env: []corev1.EnvVar{{Name: "LOG_LEVEL", Value: "info"}, {Name: "DB_HOST", Value: "db.data.svc.cluster.local"},
					{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}},
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
					Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")}},
				VolumeMounts: []corev1.VolumeMount{{Name: "config", MountPath: "/etc/app"}},
			}},
			Volumes: []corev1.Volume{{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
				LocalObjectReference: corev1.LocalObjectReference{Name: app + "-config"}}}}},
		},
		Status: corev1.PodStatus{Phase: corev1.PodRunning,
			PodIPs: []corev1.PodIP{{IP: fmt.Sprintf("10.%d.%d.%d", 128+i>>16, i>>8&255, i&255)}}},
	}
}

// residentPeak follows a process's anonymous and file-backed resident
// memory, every 10 ms, for their highest values: VmHWM has only their sum.
type residentPeak struct {
	done       chan struct{}
	stopped    chan struct{}
	anon, file float64
}

func samplePeak(p *framework.Process) *residentPeak {
	r := &residentPeak{done: make(chan struct{}), stopped: make(chan struct{})}
	go func() {
		defer close(r.stopped)
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			if st, err := procStatusMB(p); err == nil {
				r.anon, r.file = max(r.anon, st["RssAnon:"]), max(r.file, st["RssFile:"])
			}
			select {
			case <-r.done:
				return
			case <-t.C:
			}
		}
	}()
	return r
}

// stop ends the sampling and returns the highest values seen, in MB.
func (r *residentPeak) stop() (anon, file float64) {
	close(r.done)
	<-r.stopped
	return r.anon, r.file
}
