package scale

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/netplane/netplane/e2e/framework"
)

// kubeProxyResult is kube-proxy's first sync of the same Services.
type kubeProxyResult struct {
	fromLists, fromStart time.Duration // zero: not run, or not done in time
	hwmKiB               int
	limit                time.Duration
}

// kubeProxyLimit is how long kube-proxy is given for its first sync.
const kubeProxyLimit = 20 * time.Minute

// runKubeProxy runs kube-proxy (nftables mode) as Node 0 in a namespace of
// its own, until its first sync is done: its "SyncProxyRules complete"
// line after its Service and EndpointSlice caches synced.
func runKubeProxy(b *testing.B, api *framework.APIServer) (r kubeProxyResult) {
	r.limit = kubeProxyLimit
	bin := framework.RequireBinary(b, "kube-proxy")
	ns := nodeNS(b)
	kc := filepath.Join(b.TempDir(), "kubeconfig")
	fwd := ns.Forward(b, "127.0.0.1:0", strings.TrimPrefix(api.URL, "https://"))
	if err := api.WriteKubeconfig(kc, "https://"+fwd, api.Token); err != nil {
		b.Fatal(err)
	}
	t0 := time.Now()
	p := ns.Start(b, bin, "--proxy-mode=nftables", "--v=2", "--kubeconfig="+kc, "--hostname-override="+NodeName(0), "--cluster-cidr="+ClusterCIDR,
		"--healthz-bind-address=127.0.0.1:10256", "--metrics-bind-address="+metricsAddr,
		"--conntrack-max-per-core=0", "--conntrack-min=0", "--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0")
	defer p.Stop(10 * time.Second)
	var done time.Time
	err := framework.Poll(benchCtx(b), 100*time.Millisecond, kubeProxyLimit, "kube-proxy's first sync", func(context.Context) error {
		if done, _ = framework.LogLine(p.Log, false, "SyncProxyRules complete"); done.IsZero() {
			if p.Exited() {
				return framework.Final(errors.New("kube-proxy exited"))
			}
			return errors.New("not synced yet")
		}
		return nil
	})
	r.hwmKiB = framework.StatusKiB(p.Cmd.Process.Pid, "VmHWM")
	if err != nil {
		b.Logf("kube-proxy: %v (load %s); log tail:\n%s", err, framework.LoadAverage(), p.Tail(10))
		return r
	}
	svc, _ := framework.LogLine(p.Log, true, "Caches are synced", "service config")
	eps, _ := framework.LogLine(p.Log, true, "Caches are synced", "endpoint slice config")
	r.fromStart, r.fromLists = done.Sub(t0), done.Sub(later(svc, eps))
	b.Logf("kube-proxy: first sync %v from its lists (%v from start), peak RSS %d MiB; load %s",
		r.fromLists.Round(time.Millisecond), r.fromStart.Round(time.Millisecond), r.hwmKiB/1024, framework.LoadAverage())
	return r
}

// report logs the run's figures and reports them as metrics.
func report(b *testing.B, np nodeResult, kp kubeProxyResult) {
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(np.fromLists.Seconds(), "node-full-sync-s")
	b.ReportMetric(np.policyTook.Seconds(), "policy-full-sync-s")
	b.ReportMetric(float64(np.rssPeak)/1024, "node-peak-MiB")
	b.ReportMetric(ms(np.endpointP99), "endpoint-change-p99-ms")
	b.ReportMetric(ms(np.policyP99), "policy-change-p99-ms")
	b.ReportMetric(float64(np.packetTable)/float64(np.packetNone), "first-packet-p50-ratio")
	b.ReportMetric(np.churnBytesPerSec/1024, "churn-KiB/s")
	line := fmt.Sprintf("node role: full sync %v from lists (proxy %v, NetworkPolicy %v took %v, overlay %v); VmRSS %d MiB synced, VmHWM %d MiB; endpoint change p50 %v p99 %v; policy change p50 %v p99 %v; first packet p50 %v vs %v bypassed (%.2fx), p99 %v vs %v; from the API server %.1f KiB/s idle, %.1f KiB/s at %.0f pod changes/s (%.0f bytes per change), %.2f CPUs used over both windows; per EndpointSlice change %.0f bytes, per policy change %.0f",
		np.fromLists.Round(time.Millisecond), np.proxy.Round(time.Millisecond), np.policy.Round(time.Millisecond), np.policyTook, np.overlay.Round(time.Millisecond),
		np.rssSynced/1024, np.rssPeak/1024, np.endpointP50.Round(10*time.Microsecond), np.endpointP99.Round(10*time.Microsecond),
		np.policyP50.Round(10*time.Microsecond), np.policyP99.Round(10*time.Microsecond),
		np.packetTable, np.packetNone, float64(np.packetTable)/float64(np.packetNone), np.packetTableP99, np.packetNoneP99,
		np.idleBytesPerSec/1024, np.churnBytesPerSec/1024, np.churn, (np.churnBytesPerSec-np.idleBytesPerSec)/max(np.churn, 1), np.cpu,
		np.bytesPerSlice, np.bytesPerPolicy)
	if kp.fromLists > 0 {
		b.ReportMetric(kp.fromLists.Seconds(), "kube-proxy-full-sync-s")
		line += fmt.Sprintf("; kube-proxy full sync %v from lists: netplane's proxy %.1fx faster; kube-proxy VmHWM %d MiB",
			kp.fromLists.Round(time.Millisecond), kp.fromLists.Seconds()/np.proxy.Seconds(), kp.hwmKiB/1024)
	} else if kp.limit > 0 {
		line += fmt.Sprintf("; kube-proxy did not finish its first sync within %v", kp.limit)
	}
	b.Logf("%s; load %s", line, framework.LoadAverage())
}
