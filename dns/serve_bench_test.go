package dns

import (
	"context"
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/netplane/netplane/e2e/framework"
)

// BenchmarkServingPath measures the query path alone: the sockets, the
// handler and the forwarding cache over an index of 10,000 Services
// (NETPLANE_DNS_BENCH_SERVICES) in 100 namespaces, with no API server, so
// that a CPU profile of the test binary (-cpuprofile) shows where a query's
// time goes. dnsperf sends the benchmark's two query files from CPU 0; run
// the test binary on the other CPU (taskset -c 1, GOMAXPROCS=1) to
// measure one core.
func BenchmarkServingPath(b *testing.B) {
	dnsperf := framework.RequireBinary(b, "dnsperf")
	framework.RequireBinary(b, "taskset")
	nSvc := envInt("NETPLANE_DNS_BENCH_SERVICES", 10000)
	up := startUpstream(b, nil)
	m, err := newMetrics(nil, "dns://bench", "cluster.local.")
	if err != nil {
		b.Fatal(err)
	}
	fwd := NewForwarder([]string{up.Addr}, 2*time.Second, NewCache(10000, 30*time.Second, 0), m)
	h := NewHandler(testZone(podsInsecure), fwd, m, true, nil)
	h.SetIndex(benchIndex(nSvc))
	l, err := Listen("127.0.0.1:0", runtime.GOMAXPROCS(0))
	if err != nil {
		b.Fatal(err)
	}
	l.Serve(h)
	b.Cleanup(func() { l.Shutdown(context.Background()) })
	cluster, mix := writeQueryFiles(b, b.TempDir(), nSvc)
	b.ResetTimer()
	for range b.N {
		s := &benchServer{addr: l.Addr, cpus: oneCPU}
		for _, f := range []struct{ name, file string }{{"cluster", cluster}, {"mix", mix}} {
			cpu := selfCPUSeconds()
			qps := runDNSPerf(b, dnsperf, s, f.file)
			b.ReportMetric(qps, f.name+"-qps")
			b.ReportMetric(qps*dnsperfSeconds/(selfCPUSeconds()-cpu), f.name+"-queries/cpu-s")
		}
	}
}

// selfCPUSeconds is the CPU time the test process has used.
func selfCPUSeconds() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// benchIndex is a synced index of n ClusterIP Services named as
// BenchmarkAgainstCoreDNS names them.
func benchIndex(n int) *Index {
	c := NewIndex().Edit()
	for i := range benchNamespaces {
		c.SetNamespace(fmt.Sprintf("ns-%d", i), true)
	}
	for i := range n {
		ip := fmt.Sprintf("10.96.%d.%d", i>>8&255, i&255)
		svc := clusterIPService(fmt.Sprintf("ns-%d", i%benchNamespaces), fmt.Sprintf("svc-%d", i), []string{ip}, httpPort())
		c.SetService(svcKey{svc.Namespace, svc.Name}, buildService(svc, nil))
	}
	c.MarkSynced()
	return c.Done(1700000000)
}
