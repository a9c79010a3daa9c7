package dns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/internal/informer"
	"github.com/netplane/netplane/internal/role"
)

// One API server serves every test of the package that needs one; it
// starts on first use (4 s) and stops in TestMain.
func TestMain(m *testing.M) { framework.RunShared(m) }

// fixtureOnce creates the CoreDNS fixture on the shared API server once.
var fixtureOnce sync.Once

func createFixture(t *testing.T, c kubernetes.Interface) {
	t.Helper()
	var err error
	fixtureOnce.Do(func() { err = createObjects(context.Background(), c, fixture()) })
	if err != nil {
		t.Fatal(err)
	}
}

func createObjects(ctx context.Context, c kubernetes.Interface, o fixtureObjects) error {
	for _, ns := range o.namespaces {
		_, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		if err != nil && !strings.Contains(err.Error(), "already exists") {
			return err
		}
	}
	for _, s := range o.services {
		s = s.DeepCopy()
		if len(s.Spec.ClusterIPs) > 1 {
			s.Spec.IPFamilyPolicy = ptrTo(corev1.IPFamilyPolicyRequireDualStack)
		}
		if _, err := c.CoreV1().Services(s.Namespace).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("service %s/%s: %w", s.Namespace, s.Name, err)
		}
	}
	for _, sl := range o.slices {
		if _, err := c.DiscoveryV1().EndpointSlices(sl.Namespace).Create(ctx, sl, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("slice %s/%s: %w", sl.Namespace, sl.Name, err)
		}
	}
	for _, p := range o.pods {
		if err := createPod(ctx, c, p); err != nil {
			return err
		}
	}
	return nil
}

// createPod creates a pod of one pause container with its status.
func createPod(ctx context.Context, c kubernetes.Interface, p *corev1.Pod) error {
	p = p.DeepCopy()
	p.Spec.Containers = []corev1.Container{{Name: "c", Image: "pause"}}
	_, err := framework.CreatePod(ctx, c, p)
	return err
}

func ptrTo[T any](v T) *T { return &v }

// dnsConfig is the role's configuration for a test server on a free
// loopback port forwarding to upstream.
func dnsConfig(t *testing.T, upstream string) v1alpha1.DNS {
	t.Helper()
	c := v1alpha1.Default().DNS
	c.BindAddress = "127.0.0.1:0"
	c.UpstreamServers = []string{upstream}
	c.UpstreamTimeout = metav1.Duration{Duration: 500 * time.Millisecond}
	// A resolv.conf of the test's own, so the machine's search domains and
	// servers never play a part.
	c.ResolvConf = filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(c.ResolvConf, []byte("search corp.example\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return c
}

// startServer runs a DNS server for the test and waits for it to sync
// (unless wait is false).
func startServer(t *testing.T, c v1alpha1.DNS, client kubernetes.Interface, wait bool) (*Server, *prometheus.Registry) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	reg := prometheus.NewRegistry()
	s, err := Start(ctx, c, client, reg, testr.New(t))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		sctx, scancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer scancel()
		s.Listeners.Shutdown(sctx)
	})
	if wait {
		framework.EventuallyEvery(t, 2*time.Millisecond, 10*time.Second, "the DNS server to sync", s.Ready)
	}
	return s, reg
}

// wantAnswers says how m differs from an answer of n records.
func wantAnswers(m *dns.Msg, n int) error {
	if len(m.Answer) != n {
		return fmt.Errorf("%d answers (rcode %s), want %d", len(m.Answer), dns.RcodeToString[m.Rcode], n)
	}
	return nil
}

// ask sends one question over net ("udp" or "tcp"), from local if valid.
func ask(t *testing.T, network, server string, req *dns.Msg, local netip.Addr) *dns.Msg {
	t.Helper()
	c := &dns.Client{Net: network, Timeout: 3 * time.Second, UDPSize: 65535}
	if local.IsValid() {
		if network == "tcp" {
			c.Dialer = &net.Dialer{LocalAddr: &net.TCPAddr{IP: local.AsSlice()}}
		} else {
			c.Dialer = &net.Dialer{LocalAddr: &net.UDPAddr{IP: local.AsSlice()}}
		}
	}
	m, _, err := c.Exchange(req, server)
	if err != nil {
		t.Fatalf("%s query %s %s: %v", network, req.Question[0].Name, dns.TypeToString[req.Question[0].Qtype], err)
	}
	return m
}

func withoutOPT(rs []dns.RR) []dns.RR {
	return slices.DeleteFunc(slices.Clone(rs), func(r dns.RR) bool { return r.Header().Rrtype == dns.TypeOPT })
}

// TestServesTheFixtureFromARealAPIServer runs every answer case against a
// server fed by real objects, over UDP and over TCP.
func TestServesTheFixtureFromARealAPIServer(t *testing.T) {
	api := framework.SharedAPIServer(t, framework.Options{})
	createFixture(t, api.Client)
	up := startUpstream(t, map[string]func(dns.Question) *dns.Msg{"example.net. A": answerA(60, "192.0.2.7")})
	s, _ := startServer(t, dnsConfig(t, up.Addr), api.Client, true)
	for _, network := range []string{"udp", "tcp"} {
		for _, tc := range answerCases {
			t.Run(network+" "+tc.name, func(t *testing.T) {
				m := ask(t, network, s.Listeners.Addr, query(tc.qname, tc.qtype), netip.Addr{})
				want := tc.answer
				if tc.chase == "example.net." {
					want = append(slices.Clone(want), "example.net. 60 IN A 192.0.2.7")
				}
				if m.Rcode != tc.rcode {
					t.Errorf("rcode %s, want %s", dns.RcodeToString[m.Rcode], dns.RcodeToString[tc.rcode])
				}
				if !m.Authoritative || m.Truncated {
					t.Errorf("aa=%v tc=%v, want aa and no tc", m.Authoritative, m.Truncated)
				}
				checkSection(t, "answer", m.Answer, rrs(t, want...))
				checkSection(t, "authority", m.Ns, rrs(t, tc.ns...))
				checkSection(t, "additional", withoutOPT(m.Extra), rrs(t, tc.extra...))
			})
		}
		for _, tc := range reverseCases {
			t.Run(network+" PTR "+tc.name, func(t *testing.T) {
				m := ask(t, network, s.Listeners.Addr, query(tc.qname, dns.TypePTR), netip.Addr{})
				// An address the cluster does not know goes to the (fake)
				// upstream, which has no PTR records: NXDOMAIN.
				if known := tc.want != nil; m.Authoritative != known || (m.Rcode == dns.RcodeSuccess) != known {
					t.Errorf("aa=%v rcode %s, want the cluster to know it: %v", m.Authoritative, dns.RcodeToString[m.Rcode], known)
				}
				checkSection(t, "answer", m.Answer, rrs(t, tc.want...))
			})
		}
	}
}

func TestDigSeesTheRecords(t *testing.T) {
	dig := framework.RequireBinary(t, "dig")
	api := framework.SharedAPIServer(t, framework.Options{})
	createFixture(t, api.Client)
	s, _ := startServer(t, dnsConfig(t, "127.0.0.1:1"), api.Client, true)
	host, port, _ := net.SplitHostPort(s.Listeners.Addr)
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"svc1.testns.svc.cluster.local", "A"}, "10.96.100.1"},
		{[]string{"svc-dual-stack.testns.svc.cluster.local", "AAAA"}, "fd00:10:96::3"},
		{[]string{"_http._tcp.svc1.testns.svc.cluster.local", "SRV"}, "0 100 80 svc1.testns.svc.cluster.local."},
		{[]string{"-x", "10.96.100.1"}, "svc1.testns.svc.cluster.local."},
		{[]string{"dns-version.cluster.local", "TXT"}, `"1.1.0"`},
		{[]string{"+tcp", "hdls1.testns.svc.cluster.local", "A"}, "172.16.0.2\n172.16.0.3\n172.16.0.4\n172.16.0.5"},
	}
	for _, c := range cases {
		args := append([]string{"@" + host, "-p", port, "+short", "+time=2", "+tries=1"}, c.args...)
		out, err := execOutput(dig, args...)
		got := strings.Join(sortedLines(out), "\n")
		if err != nil || got != c.want {
			t.Errorf("dig %s: %q (%v), want %q", strings.Join(c.args, " "), got, err, c.want)
		}
	}
	out, _ := execOutput(dig, "@"+host, "-p", port, "+time=2", "+tries=1", "nope.testns.svc.cluster.local", "A")
	if !strings.Contains(out, "status: NXDOMAIN") || !strings.Contains(out, "flags: qr aa rd ra") {
		t.Errorf("dig for a missing service:\n%s", out)
	}
}

func sortedLines(s string) []string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	slices.Sort(lines)
	return lines
}

func execOutput(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).CombinedOutput()
	return string(out), err
}

func TestLargeAnswersAreTruncatedOverUDPAndCompleteOverTCP(t *testing.T) {
	api := framework.SharedAPIServer(t, framework.Options{})
	ctx := framework.Ctx(t)
	o := fixtureObjects{namespaces: []string{"big"}, services: []*corev1.Service{headlessService("big", "hdls100", httpPort())}}
	var eps []ep
	for i := range 100 {
		eps = append(eps, ep{fmt.Sprintf("172.17.%d.%d", i/250, i%250+1), "", true})
	}
	o.slices = append(o.slices, slice("big", "hdls100-a", "hdls100", "IPv4", httpSlicePorts(), eps...))
	if err := createObjects(ctx, api.Client, o); err != nil {
		t.Fatal(err)
	}
	s, _ := startServer(t, dnsConfig(t, "127.0.0.1:1"), api.Client, true)
	name := "hdls100.big.svc.cluster.local."
	framework.EventuallyEvery(t, 2*time.Millisecond, 5*time.Second, "hdls100 to resolve", func() error {
		return wantAnswers(ask(t, "tcp", s.Listeners.Addr, query(name, dns.TypeA), netip.Addr{}), 100)
	})
	plain := ask(t, "udp", s.Listeners.Addr, query(name, dns.TypeA), netip.Addr{})
	edns := query(name, dns.TypeA)
	edns.SetEdns0(1232, false)
	withEDNS := ask(t, "udp", s.Listeners.Addr, edns, netip.Addr{})
	tcp := ask(t, "tcp", s.Listeners.Addr, query(name, dns.TypeA), netip.Addr{})
	t.Logf("A records: UDP 512 → %d (tc=%v), EDNS 1232 → %d (tc=%v), TCP → %d", len(plain.Answer), plain.Truncated, len(withEDNS.Answer), withEDNS.Truncated, len(tcp.Answer))
	// 16 bytes a compressed A record: 28 fit in 512, 74 in 1232.
	if !plain.Truncated || len(plain.Answer) < 25 || len(plain.Answer) >= 100 {
		t.Errorf("UDP without EDNS: %d records, tc=%v; want about 28 and TC", len(plain.Answer), plain.Truncated)
	}
	if !withEDNS.Truncated || len(withEDNS.Answer) < 70 || len(withEDNS.Answer) >= 100 {
		t.Errorf("UDP with EDNS 1232: %d records, tc=%v; want about 74 and TC", len(withEDNS.Answer), withEDNS.Truncated)
	}
	if opt := withEDNS.IsEdns0(); opt == nil || opt.UDPSize() != 1232 {
		t.Errorf("the reply does not mirror the client's EDNS0 size: %v", opt)
	}
	if tcp.Truncated || len(tcp.Answer) != 100 {
		t.Errorf("TCP: %d records, tc=%v; want all 100", len(tcp.Answer), tcp.Truncated)
	}
}

// TestChangesAreServedWithin100ms measures from the API write returning to
// the first answer that shows it. Each change must show within a second
// (a loaded CI machine), and the median within 100 ms.
func TestChangesAreServedWithin100ms(t *testing.T) {
	api := framework.SharedAPIServer(t, framework.Options{})
	ctx := framework.Ctx(t)
	if err := createObjects(ctx, api.Client, fixtureObjects{namespaces: []string{"churn"}}); err != nil {
		t.Fatal(err)
	}
	s, reg := startServer(t, dnsConfig(t, "127.0.0.1:1"), api.Client, true)
	var took []time.Duration
	for i := range 5 {
		name := fmt.Sprintf("new%d", i)
		svc := clusterIPService("churn", name, []string{fmt.Sprintf("10.96.200.%d", i+1)}, httpPort())
		if _, err := api.Client.CoreV1().Services("churn").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		took = append(took, framework.EventuallyEvery(t, 2*time.Millisecond, time.Second, "a new Service to resolve", func() error {
			if m := ask(t, "udp", s.Listeners.Addr, query(name+".churn.svc.cluster.local.", dns.TypeA), netip.Addr{}); m.Rcode != dns.RcodeSuccess {
				return fmt.Errorf("rcode %s", dns.RcodeToString[m.Rcode])
			}
			return nil
		}))
	}
	// An endpoint becoming unready leaves the headless answer.
	sl := slice("churn", "web-a", "web", "IPv4", httpSlicePorts(), ep{"172.18.0.1", "", true}, ep{"172.18.0.2", "", true})
	if err := createObjects(ctx, api.Client, fixtureObjects{services: []*corev1.Service{headlessService("churn", "web", httpPort())}}); err != nil {
		t.Fatal(err)
	}
	sl.Annotations = map[string]string{triggerTimeAnnotation: time.Now().UTC().Format(time.RFC3339)}
	created, err := api.Client.DiscoveryV1().EndpointSlices("churn").Create(ctx, sl, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	webA := func(n int) func() error {
		return func() error {
			return wantAnswers(ask(t, "udp", s.Listeners.Addr, query("web.churn.svc.cluster.local.", dns.TypeA), netip.Addr{}), n)
		}
	}
	framework.EventuallyEvery(t, 2*time.Millisecond, time.Second, "web to have 2 endpoints", webA(2))
	for i := range 2 {
		created.Endpoints[i].Conditions.Ready = ptrTo(false)
		created.Annotations[triggerTimeAnnotation] = time.Now().UTC().Format(time.RFC3339)
		if created, err = api.Client.DiscoveryV1().EndpointSlices("churn").Update(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		want := 1 - i
		took = append(took, framework.EventuallyEvery(t, 2*time.Millisecond, time.Second, "an unready endpoint to leave the answer", webA(want)))
	}
	// With no ready endpoint left, the headless Service is NXDOMAIN.
	if m := ask(t, "udp", s.Listeners.Addr, query("web.churn.svc.cluster.local.", dns.TypeA), netip.Addr{}); m.Rcode != dns.RcodeNameError {
		t.Errorf("headless service without ready endpoints: %s, want NXDOMAIN", dns.RcodeToString[m.Rcode])
	}
	slices.Sort(took)
	t.Logf("API write → first answer: %v", took)
	if med := took[len(took)/2]; med > 100*time.Millisecond {
		t.Errorf("median %v from API write to answer, want ≤ 100ms", med)
	}
	if !gathered(t, reg, "coredns_kubernetes_dns_programming_duration_seconds") {
		t.Error("no DNS programming latency was observed for the slice updates")
	}
}

// TestServfailUntilSyncedAndForwardsMeanwhile points the server at an API
// server that does not answer: it must serve at once, SERVFAIL the cluster
// zone, forward other names, report not ready, and keep running.
func TestServfailUntilSyncedAndForwardsMeanwhile(t *testing.T) {
	up := startUpstream(t, map[string]func(dns.Question) *dns.Msg{"example.com. A": answerA(60, "192.0.2.1")})
	dead, err := kubernetes.NewForConfig(&restConfigForNowhere)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := startServer(t, dnsConfig(t, up.Addr), dead, false)
	for range 3 {
		for _, q := range []string{"svc1.testns.svc.cluster.local.", "nope.testns.svc.cluster.local.", "cluster.local."} {
			if m := ask(t, "udp", s.Listeners.Addr, query(q, dns.TypeA), netip.Addr{}); m.Rcode != dns.RcodeServerFailure {
				t.Errorf("%s before sync: %s, want SERVFAIL", q, dns.RcodeToString[m.Rcode])
			}
		}
		if m := ask(t, "udp", s.Listeners.Addr, query("example.com.", dns.TypeA), netip.Addr{}); m.Rcode != dns.RcodeSuccess || len(m.Answer) != 1 {
			t.Errorf("example.com before sync: %v", m)
		}
		if s.Ready() == nil {
			t.Error("ready without an API server")
		}
		time.Sleep(300 * time.Millisecond) // let the informers fail and retry in between
	}
}

func TestVerifiedPodRecordsFollowRealPods(t *testing.T) {
	api := framework.SharedAPIServer(t, framework.Options{})
	createFixture(t, api.Client)
	c := dnsConfig(t, "127.0.0.1:1")
	c.PodRecords = podsVerified
	s, _ := startServer(t, c, api.Client, true)
	for name, rcode := range map[string]int{
		"10-244-1-7.testns.pod.cluster.local.": dns.RcodeSuccess,
		"10-244-1-8.testns.pod.cluster.local.": dns.RcodeNameError,
		"10-244-1-7.other.pod.cluster.local.":  dns.RcodeNameError,
	} {
		if m := ask(t, "udp", s.Listeners.Addr, query(name, dns.TypeA), netip.Addr{}); m.Rcode != rcode {
			t.Errorf("%s with verified pod records: %s, want %s", name, dns.RcodeToString[m.Rcode], dns.RcodeToString[rcode])
		}
	}
	c.PodRecords = podsDisabled
	d, _ := startServer(t, c, api.Client, true)
	if m := ask(t, "udp", d.Listeners.Addr, query("10-244-1-7.testns.pod.cluster.local.", dns.TypeA), netip.Addr{}); m.Rcode != dns.RcodeNameError {
		t.Errorf("disabled pod records: %s, want NXDOMAIN", dns.RcodeToString[m.Rcode])
	}
}

// TestAutopathForARealPod makes a pod whose IP is a loopback address the
// test sends from, so the server sees the query come from that pod.
func TestAutopathForARealPod(t *testing.T) {
	api := framework.SharedAPIServer(t, framework.Options{})
	createFixture(t, api.Client)
	ctx := framework.Ctx(t)
	podIP := netip.MustParseAddr("127.0.0.77")
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "testns", Name: "loopback-client"},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: podIP.String()}}}}
	if err := createPod(ctx, api.Client, pod); err != nil {
		t.Fatal(err)
	}
	up := startUpstream(t, map[string]func(dns.Question) *dns.Msg{"foo.example.net. A": answerA(60, "192.0.2.9")})
	s, _ := startServer(t, dnsConfig(t, up.Addr), api.Client, true)
	framework.EventuallyEvery(t, 2*time.Millisecond, 5*time.Second, "the pod to be indexed", func() error {
		if _, ok := s.Handler.Index().podNamespace(podIP); !ok {
			return fmt.Errorf("%s not in the index", podIP)
		}
		return nil
	})
	for _, network := range []string{"udp", "tcp"} {
		m := ask(t, network, s.Listeners.Addr, query("svc1.other.testns.svc.cluster.local.", dns.TypeA), podIP)
		checkSection(t, network+" answer", m.Answer, rrs(t,
			"svc1.other.testns.svc.cluster.local. 5 IN CNAME svc1.other.svc.cluster.local.",
			"svc1.other.svc.cluster.local. 5 IN A 10.96.100.9"))
		m = ask(t, network, s.Listeners.Addr, query("foo.example.net.testns.svc.cluster.local.", dns.TypeA), podIP)
		checkSection(t, network+" answer", m.Answer, rrs(t,
			"foo.example.net.testns.svc.cluster.local. 5 IN CNAME foo.example.net.",
			"foo.example.net. 60 IN A 192.0.2.9"))
	}
	// The same query from an address that is no pod walks no search path.
	if m := ask(t, "udp", s.Listeners.Addr, query("svc1.other.testns.svc.cluster.local.", dns.TypeA), netip.MustParseAddr("127.0.0.78")); m.Rcode != dns.RcodeNameError {
		t.Errorf("from a non-pod: %s, want NXDOMAIN", dns.RcodeToString[m.Rcode])
	}
}

// restConfigForNowhere is an API server address nothing listens on.
var restConfigForNowhere = rest.Config{Host: "https://127.0.0.1:1", Timeout: time.Second}

// TestRunIsTheRole runs the role as cmd/netplane does: ready once synced;
// after the stop, not ready but still answering for the lameduck period;
// then nil.
func TestRunIsTheRole(t *testing.T) {
	api := framework.SharedAPIServer(t, framework.Options{})
	cfg := v1alpha1.Default()
	cfg.DNS = dnsConfig(t, "127.0.0.1:1")
	pc, l := listenBoth(t) // a port free for both, handed to the role
	cfg.DNS.BindAddress = pc.LocalAddr().String()
	cfg.DNS.Lameduck.Duration = time.Second
	pc.Close()
	l.Close()
	checks := role.NewChecks()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	parts := Role(role.Deps{Config: cfg, RestConfig: api.RestConfig, Client: api.Client, Factory: informer.New(api.Client),
		Checks: checks, Metrics: prometheus.NewRegistry(), Log: testr.New(t)})
	go func() { done <- parts[0].Run(ctx) }()
	// An answer from the cluster zone means the server started, and so its
	// readiness check is in place.
	framework.EventuallyEvery(t, 2*time.Millisecond, 10*time.Second, "the dns role to answer", func() error {
		c := &dns.Client{Timeout: 100 * time.Millisecond}
		m, _, err := c.Exchange(query("dns-version.cluster.local.", dns.TypeTXT), cfg.DNS.BindAddress)
		if err == nil && m.Rcode != dns.RcodeSuccess {
			err = fmt.Errorf("rcode %s", dns.RcodeToString[m.Rcode])
		}
		return err
	})
	framework.EventuallyEvery(t, 2*time.Millisecond, time.Second, "the dns role to be ready", checks.Ready)
	cancel()
	stopped := time.Now()
	framework.EventuallyEvery(t, 2*time.Millisecond, time.Second, "the dns role to turn not ready", func() error {
		if checks.Ready() == nil {
			return errors.New("still ready")
		}
		return nil
	})
	c := &dns.Client{Timeout: 200 * time.Millisecond}
	if m, _, err := c.Exchange(query("dns-version.cluster.local.", dns.TypeTXT), cfg.DNS.BindAddress); err != nil || m.Rcode != dns.RcodeSuccess {
		t.Errorf("during the lameduck period: %v %v, want an answer", m, err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run returned %v on a graceful stop, want nil", err)
		}
		if took := time.Since(stopped); took < 900*time.Millisecond {
			t.Errorf("Run returned %v after the stop, before its 1s lameduck", took)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return within 5s of its context ending")
	}
}
