package dns

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
)

// TestGetaddrinfoQueriesWithAndWithoutAutopath counts the queries one
// getaddrinfo (glibc, through `getent ahosts`) sends from a pod with the
// kubelet's resolv.conf (ndots:5, three cluster search domains) for the
// three usual kinds of name, against a server with autopath and one
// without. The pod and the servers are network namespaces joined by a
// veth; the servers listen on port 53 there, which glibc needs.
func TestGetaddrinfoQueriesWithAndWithoutAutopath(t *testing.T) {
	framework.RequireBinary(t, "getent")
	api := framework.SharedAPIServer(t, framework.Options{})
	createFixture(t, api.Client)
	ctx := framework.Ctx(t)
	const podIP, withAP, withoutAP = "10.250.0.20", "10.250.0.10", "10.250.0.11"
	if err := createPod(ctx, api.Client, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "testns", Name: "resolver-client"},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: podIP}}}}); err != nil {
		t.Fatal(err)
	}
	dnsNS, podNS := netns.New(t, "dns"), netns.New(t, "pod")
	netns.Veth(t, dnsNS, "eth0", podNS, "eth0")
	dnsNS.Addr(t, "eth0", withAP+"/24")
	dnsNS.Addr(t, "eth0", withoutAP+"/24")
	podNS.Addr(t, "eth0", podIP+"/24")

	up := startUpstream(t, map[string]func(dns.Question) *dns.Msg{
		"example.com. A": answerA(60, "192.0.2.1"),
		"example.com. AAAA": func(dns.Question) *dns.Msg {
			m := new(dns.Msg)
			m.Ns = rrs(t, "com. 60 IN SOA a.com. b.com. 1 2 3 4 60")
			return m
		},
	})
	counters := map[string]func() float64{}
	for addr, autopath := range map[string]bool{withAP: true, withoutAP: false} {
		c := dnsConfig(t, up.Addr)
		c.Autopath = autopath
		c.CacheSize = 0 // every query counted is one the client sent
		var l *Listeners
		if err := dnsNS.Do(func() (err error) { l, err = Listen(addr+":53", 1); return err }); err != nil {
			t.Fatal(err)
		}
		reg := prometheus.NewRegistry()
		sctx, cancel := context.WithCancel(context.Background())
		s, err := StartOn(sctx, l, c, api.Client, reg, testr.New(t))
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		t.Cleanup(func() { cancel(); s.Listeners.Shutdown(context.Background()) })
		framework.EventuallyEvery(t, 2*time.Millisecond, 10*time.Second, "the server to sync", func() error {
			if _, ok := s.Handler.Index().podNamespace(netip.MustParseAddr(podIP)); !ok && autopath {
				return fmt.Errorf("%s not in the index", podIP)
			}
			return s.Ready()
		})
		counters[addr] = func() float64 { return sumCounter(t, reg, "coredns_dns_requests_total") }
	}

	// The kubelet's resolv.conf for a ClusterFirst pod in testns; `ip netns
	// exec` mounts /etc/netns/<ns>/resolv.conf over /etc/resolv.conf.
	etc := filepath.Join("/etc/netns", podNS.Name)
	if err := os.MkdirAll(etc, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(etc) })
	for _, name := range []string{"svc1.testns", "svc1.testns.svc.cluster.local", "example.com"} {
		counts := map[string]float64{}
		for _, server := range []string{withAP, withoutAP} {
			conf := "nameserver " + server + "\nsearch testns.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n"
			if err := os.WriteFile(filepath.Join(etc, "resolv.conf"), []byte(conf), 0o644); err != nil {
				t.Fatal(err)
			}
			before := counters[server]()
			out, err := execOutput("ip", "netns", "exec", podNS.Name, "getent", "ahosts", name)
			if err != nil || !strings.Contains(out, "STREAM") {
				t.Fatalf("getent ahosts %s via %s: %v\n%s", name, server, err, out)
			}
			counts[server] = counters[server]() - before
		}
		t.Logf("getaddrinfo(%q): %v queries with autopath, %v without", name, counts[withAP], counts[withoutAP])
		if counts[withAP] > 2 || counts[withoutAP] <= counts[withAP] {
			t.Errorf("getaddrinfo(%q): %v queries with autopath, %v without; want at most 2 with, more without", name, counts[withAP], counts[withoutAP])
		}
	}
}

func sumCounter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}
