package proxy

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
)

// BenchmarkSyncAgainstKubeProxy runs netplane's node role and kube-proxy
// (nftables mode, bin/kube-proxy from `make anchors`) each in its own node
// namespace against the same API server holding N Services × 10 endpoints
// (N from NETPLANE_BENCH_SERVICES, default 1000), and reports for each: time
// from process start to the last Service being programmed, time for one
// endpoint change to reach the kernel, and peak resident memory.
func BenchmarkSyncAgainstKubeProxy(b *testing.B) {
	framework.RequireRoot(b)
	kp := framework.RequireBinary(b, "kube-proxy")
	n := 1000
	if v, err := strconv.Atoi(os.Getenv("NETPLANE_BENCH_SERVICES")); err == nil && v > 0 {
		n = v
	}
	api := framework.StartAPIServer(b, framework.Options{})
	ctx := framework.Ctx(b)
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}
	node, err := api.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	node.Status.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "192.168.0.2"}}
	if _, err := api.Client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	lastIP := createServices(b, api, n)
	b.Logf("created %d Services × 10 endpoints in %v", n, time.Since(start).Round(time.Millisecond))

	type result struct {
		sync, change time.Duration
		rssKiB       int
		err          error
	}
	run := func(name, table string, args func(kubeconfig string) (string, []string)) (r result) {
		ns := netns.New(b, name)
		netns.Veth(b, ns, "eth0", netns.New(b, name+"-peer"), "eth0")
		ns.MustExec(b, "ip", "addr", "add", "192.168.0.2/24", "dev", "eth0")
		ns.MustExec(b, "ip", "route", "add", "default", "via", "192.168.0.1")
		fwd := ns.Forward(b, "127.0.0.1:0", strings.TrimPrefix(api.URL, "https://"))
		kc := filepath.Join(b.TempDir(), "kubeconfig")
		if err := api.WriteKubeconfig(kc, "https://"+fwd, api.Token); err != nil {
			b.Fatal(err)
		}
		bin, a := args(kc)
		t0 := time.Now()
		p := ns.Start(b, bin, a...)
		defer p.Stop(10 * time.Second)
		if r.err = waitFor(ns, table, lastIP, 5*time.Minute); r.err != nil {
			r.err = fmt.Errorf("%w; log tail:\n%s", r.err, p.Tail(30))
			return r
		}
		r.sync = time.Since(t0)
		newIP := fmt.Sprintf("10.250.%d.%d", len(name), 7)
		// Both proxies hold syncs --min-sync-period (1 s) apart: let it pass,
		// so the change measures the sync and not the rate limit.
		time.Sleep(2 * time.Second)
		t1 := time.Now()
		changeLastEndpoint(b, api, n, newIP)
		r.err = waitFor(ns, table, newIP, 2*time.Minute)
		r.change = time.Since(t1)
		r.rssKiB = peakRSS(p.Cmd.Process.Pid)
		b.Logf("%s, %d Services × 10 endpoints: programmed %v after start, one endpoint change in %v, peak RSS %d MiB",
			name, n, r.sync.Round(time.Millisecond), r.change.Round(time.Millisecond), r.rssKiB/1024)
		return r
	}
	tmp := b.TempDir()
	np := run("netplane", "netplane", func(kc string) (string, []string) {
		return netplaneBinary(b), []string{"--role=node", "--kubeconfig=" + kc, "--node-name=node-a", "--cluster-cidr=10.244.0.0/16",
			"--health-bind-address=127.0.0.1:0", "--metrics-bind-address=", "--cni-conf-dir=" + tmp, "--cni-bin-dir=" + tmp, "--ipam-state-dir=" + tmp, "--bridge=np-bench0"}
	})
	kube := run("kube-proxy", "kube-proxy", func(kc string) (string, []string) {
		return kp, []string{"--proxy-mode=nftables", "--kubeconfig=" + kc, "--hostname-override=node-a", "--cluster-cidr=10.244.0.0/16",
			// Fixed ports on the namespace's own loopback (kube-proxy refuses port 0);
			// no conntrack sysctls: they are not the namespace's to set.
			"--healthz-bind-address=127.0.0.1:10256", "--metrics-bind-address=127.0.0.1:10249",
			"--conntrack-max-per-core=0", "--conntrack-min=0",
			"--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0"}
	})
	if np.err != nil {
		b.Fatalf("netplane: %v", np.err)
	}
	b.ReportMetric(np.sync.Seconds(), "netplane-full-sync-s")
	b.ReportMetric(np.change.Seconds(), "netplane-change-s")
	b.ReportMetric(float64(np.rssKiB)/1024, "netplane-peak-MiB")
	if kube.err != nil {
		b.Fatalf("kube-proxy, so no ratio: %v", kube.err)
	}
	b.ReportMetric(kube.sync.Seconds(), "kube-proxy-full-sync-s")
	b.ReportMetric(kube.change.Seconds(), "kube-proxy-change-s")
	b.ReportMetric(float64(kube.rssKiB)/1024, "kube-proxy-peak-MiB")
	b.Logf("%d Services: full sync from start netplane %v vs kube-proxy %v (%.1fx); one endpoint change %v vs %v (%.1fx); peak RSS %d vs %d MiB",
		n, np.sync.Round(time.Millisecond), kube.sync.Round(time.Millisecond), kube.sync.Seconds()/np.sync.Seconds(),
		np.change.Round(time.Millisecond), kube.change.Round(time.Millisecond), kube.change.Seconds()/np.change.Seconds(),
		np.rssKiB/1024, kube.rssKiB/1024)
}

// createServices makes n ClusterIP Services with one slice of 10 endpoints
// each, 16 at a time, and returns the ClusterIP of the last one.
func createServices(b *testing.B, api *framework.APIServer, n int) string {
	ctx := framework.Ctx(b)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	ips := make([]string, n)
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			s := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("svc%d", i)},
				Spec: v1.ServiceSpec{Ports: []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: 80}}}}
			s, err := api.Client.CoreV1().Services("default").Create(ctx, s, metav1.CreateOptions{})
			if err != nil {
				errs <- err
				return
			}
			ips[i] = s.Spec.ClusterIP
			if _, err := api.Client.DiscoveryV1().EndpointSlices("default").Create(ctx, benchSlice(i, ""), metav1.CreateOptions{}); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return ips[n-1]
}

func benchSlice(i int, lastIP string) *discovery.EndpointSlice {
	s := &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("svc%d-a", i), Labels: map[string]string{discovery.LabelServiceName: fmt.Sprintf("svc%d", i)}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(v1.ProtocolTCP), Port: ptr.To[int32](8080)}},
	}
	for j := 0; j < 10; j++ {
		ip := fmt.Sprintf("10.%d.%d.%d", 100+j, i/250, i%250+1)
		if j == 9 && lastIP != "" {
			ip = lastIP
		}
		s.Endpoints = append(s.Endpoints, discovery.Endpoint{Addresses: []string{ip}, NodeName: ptr.To("node-b"),
			Conditions: discovery.EndpointConditions{Ready: ptr.To(true)}})
	}
	return s
}

func changeLastEndpoint(b *testing.B, api *framework.APIServer, n int, ip string) {
	ctx := framework.Ctx(b)
	c := api.Client.DiscoveryV1().EndpointSlices("default")
	old, err := c.Get(ctx, fmt.Sprintf("svc%d-a", n-1), metav1.GetOptions{})
	if err != nil {
		b.Fatal(err)
	}
	s := benchSlice(n-1, ip)
	s.ResourceVersion = old.ResourceVersion
	if _, err := c.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		b.Fatal(err)
	}
}

// waitFor polls the proxy's table until text appears in it.
func waitFor(ns *netns.NS, table, text string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if out, err := ns.Exec("nft", "list", "table", "ip", table); err == nil && strings.Contains(out, text) {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("table %s never showed %s within %v", table, text, limit)
}

func peakRSS(pid int) int {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmHWM:" {
			kib, _ := strconv.Atoi(f[1])
			return kib
		}
	}
	return 0
}
