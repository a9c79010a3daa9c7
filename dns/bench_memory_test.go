package dns

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/netplane/netplane/e2e/framework"
)

// memoryOnly is BenchmarkAgainstCoreDNS's resident memory alone
// (NETPLANE_DNS_BENCH_MEMORY=1): netplane and CoreDNS on one CPU under the
// same load as the full run (QPS of both query files, then the p99 run at half the slower's QPS),
// then each one's resident memory. NETPLANE_DNS_BENCH_BEFORE names another
// netplane binary, run as netplane-before in turn with this one,
// NETPLANE_DNS_BENCH_RUNS times each (default 1), for an A/B in the same
// conditions. NETPLANE_DNS_BENCH_PROFILE names a folder that gets each
// netplane's smaps, heap profile and Go metrics after the load, and a
// CPU profile of a second run of the search-path mix.
func memoryOnly(b *testing.B, dnsperf, netplane, coredns string, api *framework.APIServer, upstream, resolv, dir, probe string, nSvc int) {
	profile := os.Getenv("NETPLANE_DNS_BENCH_PROFILE")
	before := os.Getenv("NETPLANE_DNS_BENCH_BEFORE")
	var servers []*benchServer
	start := func(name, bin string) {
		var extra []string
		if profile != "" {
			extra = []string{fmt.Sprintf("--pprof-bind-address=127.0.0.1:%d", freePort(b))}
		}
		s := startNetplane(b, name, oneCPU, bin, api, upstream, resolv, dir, nil, extra...)
		s.pprof = strings.TrimPrefix(strings.Join(extra, ""), "--pprof-bind-address=")
		servers = append(servers, s)
	}
	for i := range envInt("NETPLANE_DNS_BENCH_RUNS", 1) {
		if before != "" {
			start(fmt.Sprintf("netplane-before-%d", i), before)
		}
		start(fmt.Sprintf("netplane-%d", i), netplane)
	}
	if coredns != "" {
		servers = append(servers, startCoreDNS(b, "coredns", oneCPU, coredns, api, upstream, dir, false))
	}
	for _, s := range servers {
		waitAnswer(b, s, probe, 5*time.Minute)
	}
	cluster, mix := writeQueryFiles(b, dir, nSvc)
	load := 0.0
	for _, s := range servers {
		measureQPS(b, dnsperf, s, cluster, mix)
		if load == 0 || s.qpsCluster < load {
			load = s.qpsCluster
		}
	}
	for _, s := range servers {
		s.p99 = runDNSPerfP99(b, dnsperf, s, mix, int(load/2))
		s.rssMB, s.anonMB, s.fileMB = residentMB(b, s.proc)
		b.Logf("%s: RSS %.1f MB (anonymous %.1f, file %.1f), load %s", s.name, s.rssMB, s.anonMB, s.fileMB, framework.LoadAverage())
		if profile != "" && s.pprof != "" {
			saveProfile(b, s, profile)
			cpuProfileOfMix(b, dnsperf, s, mix, profile)
		}
	}
	c := servers[len(servers)-1]
	for _, s := range servers {
		b.Logf("%-20s RSS %5.1f MB (anonymous %4.1f, file %4.1f) ×%.3f %s, QPS %.0f / %.0f",
			s.name, s.rssMB, s.anonMB, s.fileMB, s.rssMB/c.rssMB, c.name, s.qpsCluster, s.qpsMix)
	}
}

// cpuProfileOfMix runs the search-path mix at full speed once more, with
// a CPU profile of s taken meanwhile, into dir.
func cpuProfileOfMix(b *testing.B, dnsperf string, s *benchServer, mix, dir string) {
	got := make(chan []byte, 1)
	go func() {
		resp, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", s.pprof, dnsperfSeconds-2))
		if err != nil {
			got <- nil
			return
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		got <- data
	}()
	qps := runDNSPerf(b, dnsperf, s, mix)
	data := <-got
	if data == nil {
		b.Fatalf("no CPU profile from %s", s.pprof)
	}
	b.Logf("%s: search-mix QPS %.0f with a CPU profile taken", s.name, qps)
	if err := os.WriteFile(filepath.Join(dir, s.name+".mix.cpu.pb.gz"), data, 0o644); err != nil {
		b.Fatal(err)
	}
}

// saveProfile copies s's smaps, heap profile and metrics into dir.
func saveProfile(b *testing.B, s *benchServer, dir string) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	smaps, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", s.proc.Cmd.Process.Pid))
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, s.name+".smaps"), smaps, 0o644); err != nil {
		b.Fatal(err)
	}
	for file, path := range map[string]string{".heap.pb.gz": "/debug/pprof/heap", ".heap.txt": "/debug/pprof/heap?debug=1",
		".goroutines.txt": "/debug/pprof/goroutine?debug=1"} {
		resp, err := http.Get("http://" + s.pprof + path)
		if err != nil {
			b.Fatal(err)
		}
		data, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, s.name+file), data, 0o644); err != nil {
			b.Fatal(err)
		}
	}
}
