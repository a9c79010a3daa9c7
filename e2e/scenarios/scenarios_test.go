// Package scenarios is netplane's end-to-end suite: one 2-node lab (package
// lab) for the whole package, the Service scenarios of `make demo` as tests
// with assertions, and the disruptions an operator cares about: a node
// kubelet restart with traffic flowing, and DNS while its pod is replaced;
// then Kubernetes' own [sig-network] Conformance tests (upstream_test.go).
package scenarios

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/lab"
	"github.com/netplane/netplane/e2e/lab/scenario"
	"github.com/netplane/netplane/e2e/netns"
)

// budget is the longest the whole suite, lab start and teardown included
// (compiling the binaries not), may take on a 2-core machine: the lab's
// own scenarios, then upstream's Conformance tests (about 70 s).
const budget = 12 * time.Minute

var (
	theLab   *lab.Lab
	labErr   error // why the lab did not start
	readyErr error // why the lab is not ready for pods (a netplane component)
)

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		fmt.Fprintln(os.Stderr, "skipping the lab in -short mode")
		os.Exit(0)
	}
	if os.Geteuid() != 0 || framework.Binary("kube-apiserver") == "" || framework.Binary("containerd") == "" {
		if os.Getenv(framework.RequiredEnv) == "1" {
			fmt.Fprintln(os.Stderr, "the lab needs root and `make tools` (kube-apiserver, containerd)")
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, "skipping the lab: needs root and `make tools`")
		os.Exit(0)
	}
	framework.RemoveStaleNamespaces()
	start := time.Now()
	dir, err := os.MkdirTemp("", "netplane-lab-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ctx := context.Background()
	theLab, labErr = lab.Start(ctx, lab.Config{Nodes: 2, StateDir: dir, Log: func(f string, a ...any) {
		fmt.Fprintf(os.Stderr, "%s %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(f, a...))
	}})
	if labErr == nil {
		readyErr = theLab.WaitReady(ctx, 2*time.Minute)
	}
	code := m.Run()
	if theLab != nil {
		if err := theLab.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "lab teardown:", err)
			code = 1
		}
	}
	os.RemoveAll(dir)
	took := time.Since(start)
	if theLab != nil {
		took -= theLab.BuildTime // compiling depends on the build cache, not on the lab
	}
	if took > budget {
		fmt.Fprintf(os.Stderr, "FAIL: the lab suite took %v (without compiling), over its budget of %v\n", took.Round(time.Second), budget)
		code = 1
	} else {
		fmt.Fprintf(os.Stderr, "the lab suite took %v without compiling (budget %v)\n", took.Round(time.Second), budget)
	}
	os.Exit(code)
}

// needLab fails the test when the lab did not start.
func needLab(t *testing.T) *lab.Lab {
	t.Helper()
	if labErr != nil {
		t.Fatalf("lab did not start: %v", labErr)
	}
	return theLab
}

// needReady also fails when the nodes' pod network or the cluster DNS is
// not ready, with the tails of the node logs.
func needReady(t *testing.T) *lab.Lab {
	t.Helper()
	l := needLab(t)
	if readyErr != nil {
		var logs strings.Builder
		for _, n := range l.Nodes {
			logs.WriteString(n.Logs(15))
		}
		t.Fatalf("lab not ready for pods: %v\n%s", readyErr, logs.String())
	}
	return l
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// TestLabControlPlaneAndNodes checks the lab itself: the API server
// publishes its underlay address as the kubernetes Service's endpoint, and
// every node is registered with its InternalIPs and dual-stack pod CIDRs.
func TestLabControlPlaneAndNodes(t *testing.T) {
	l := needLab(t)
	ctx := ctxFor(t, time.Minute)
	framework.Eventually(t, 30*time.Second, "kubernetes Service endpoint", func() error {
		ep, err := l.Client.DiscoveryV1().EndpointSlices("default").Get(ctx, "kubernetes", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if len(ep.Endpoints) != 1 || ep.Endpoints[0].Addresses[0] != lab.ControlPlaneIP {
			return fmt.Errorf("endpoints %v, want %s", ep.Endpoints, lab.ControlPlaneIP)
		}
		return nil
	})
	for _, n := range l.Nodes {
		node, err := l.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var ips []string
		for _, a := range node.Status.Addresses {
			if a.Type == "InternalIP" {
				ips = append(ips, a.Address)
			}
		}
		if strings.Join(ips, ",") != n.IP+","+n.IP6 {
			t.Errorf("%s InternalIPs %v, want %s,%s", n.Name, ips, n.IP, n.IP6)
		}
		if len(node.Spec.PodCIDRs) != 2 {
			t.Errorf("%s pod CIDRs %v, want one per family", n.Name, node.Spec.PodCIDRs)
		}
	}
}

// TestScenarios runs the demo's scenarios in order, as `make demo` does.
func TestScenarios(t *testing.T) {
	for _, s := range scenario.All {
		t.Run(strings.Fields(s.Name)[0]+"_"+strings.Fields(s.Name)[1], func(t *testing.T) {
			if reason := scenario.Blocked[strings.Fields(s.Name)[0]]; reason != "" {
				t.Skip("blocked: " + reason)
			}
			l := needReady(t)
			start := time.Now()
			err := s.Run(ctxFor(t, 3*time.Minute), l, t.Logf)
			var skipped scenario.Skipped
			if errors.As(err, &skipped) {
				t.Skip(skipped.Why)
			}
			if err != nil {
				t.Fatalf("%s: %v", s.Name, err)
			}
			t.Logf("%s: ok in %v", s.Name, time.Since(start).Round(time.Millisecond))
		})
	}
}

// TestDNSAnswersWhileItsPodIsReplaced deletes one DNS pod while a client
// keeps resolving a Service name: every lookup is answered.
func TestDNSAnswersWhileItsPodIsReplaced(t *testing.T) {
	l := needReady(t)
	ctx := ctxFor(t, 3*time.Minute)
	if err := scenario.Apply(ctx, l, "01-clusterip.yaml"); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, time.Minute, "the client pod running", func() error {
		p, err := l.Client.CoreV1().Pods("default").Get(ctx, "client", metav1.GetOptions{})
		if err == nil && p.Status.Phase != corev1.PodRunning {
			err = fmt.Errorf("client is %s", p.Status.Phase)
		}
		return err
	})
	// Through containerd, so a kubelet that is busy replacing the pod
	// does not fail a lookup the DNS answered.
	load := startLoad(ctx, func() error {
		_, err := l.ExecCRI(ctx, "default", "client", "/testimage", "lookup", "nginx")
		return err
	})
	load.await(5)
	// Both DNS servers ready first. It runs before the kubelet restarts
	// below: a restarted kubelet reports its pods not ready until their
	// probes pass again (3 s apart for the chart's DNS pods), and a
	// Deployment's status can say ready before that report arrives.
	framework.Eventually(t, time.Minute, "every DNS pod ready", func() error {
		d, err := l.Client.AppsV1().Deployments(lab.DNSNamespace).Get(ctx, l.DNSDeploymentName(), metav1.GetOptions{})
		if err == nil && d.Status.ReadyReplicas != *d.Spec.Replicas {
			err = fmt.Errorf("%d of %d ready", d.Status.ReadyReplicas, *d.Spec.Replicas)
		}
		return err
	})
	pods, err := l.Client.CoreV1().Pods(lab.DNSNamespace).List(ctx, metav1.ListOptions{LabelSelector: l.DNSPodSelector()})
	if err != nil || len(pods.Items) == 0 {
		t.Fatalf("DNS pods: %v (%d)", err, len(pods.Items))
	}
	victim := pods.Items[0]
	if err := l.Client.CoreV1().Pods(lab.DNSNamespace).Delete(ctx, victim.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, 90*time.Second, "a replacement DNS pod ready", func() error {
		d, err := l.Client.AppsV1().Deployments(lab.DNSNamespace).Get(ctx, lab.DNSDeployment, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if _, err := l.Client.CoreV1().Pods(lab.DNSNamespace).Get(ctx, victim.Name, metav1.GetOptions{}); err == nil {
			return errors.New(victim.Name + " still there")
		}
		if d.Status.ReadyReplicas != *d.Spec.Replicas {
			return fmt.Errorf("%d of %d ready", d.Status.ReadyReplicas, *d.Spec.Replicas)
		}
		return nil
	})
	ok, failed, firstErr := load.stop(20)
	if failed > 0 {
		t.Fatalf("%d of %d lookups failed while the DNS pod was replaced; first: %v", failed, ok+failed, firstErr)
	}
	t.Logf("%d lookups, none failed, while %s was replaced", ok, victim.Name)
}

// TestKubeletRestartKeepsTrafficFlowing restarts the kubelet on every
// node while a client sends requests through the ClusterIP: pods keep
// running and not one request fails.
func TestKubeletRestartKeepsTrafficFlowing(t *testing.T) {
	l := needReady(t)
	ctx := ctxFor(t, 3*time.Minute)
	if err := scenario.Apply(ctx, l, "01-clusterip.yaml"); err != nil {
		t.Fatal(err)
	}
	svc, err := l.Client.CoreV1().Services("default").Get(ctx, "nginx", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + net.JoinHostPort(svc.Spec.ClusterIP, "8080") + "/"
	before := containerIDs(t, l)
	if len(before) < 3 {
		t.Fatalf("want the 3 nginx pods running first, have %v", before)
	}
	// Through containerd: kubectl exec needs the kubelet this test stops.
	load := startLoad(ctx, func() error {
		_, err := l.ExecCRI(ctx, "default", "client", "/testimage", "get", url)
		return err
	})
	for _, n := range l.Nodes {
		n.StopKubelet()
		load.await(10) // traffic goes on while the kubelet is down
		if err := n.StartKubelet(); err != nil {
			t.Fatal(err)
		}
	}
	load.await(10)
	if after := containerIDs(t, l); !reflect.DeepEqual(after, before) {
		t.Errorf("the restarted kubelets replaced containers: before %v, after %v", before, after)
	}
	ok, failed, firstErr := load.stop(20)
	if failed > 0 {
		t.Fatalf("%d of %d requests failed during the kubelet restarts; first: %v", failed, ok+failed, firstErr)
	}
	t.Logf("%d requests, none failed, across the kubelet restarts", ok)
}

// load repeats a request until stopped, counting outcomes.
type load struct {
	ok, failed atomic.Int64
	mu         sync.Mutex
	firstErr   error
	done       chan struct{}
	stopped    chan struct{}
}

func startLoad(ctx context.Context, req func() error) *load {
	l := &load{done: make(chan struct{}), stopped: make(chan struct{})}
	go func() {
		defer close(l.stopped)
		for {
			select {
			case <-l.done:
				return
			case <-ctx.Done():
				return
			default:
			}
			if err := req(); err != nil {
				l.failed.Add(1)
				l.mu.Lock()
				if l.firstErr == nil {
					l.firstErr = fmt.Errorf("at %s: %w", time.Now().Format("15:04:05.000"), err)
				}
				l.mu.Unlock()
			} else {
				l.ok.Add(1)
			}
		}
	}()
	return l
}

// await waits until n more requests have finished.
func (l *load) await(n int64) {
	target := l.ok.Load() + l.failed.Load() + n
	for l.ok.Load()+l.failed.Load() < target {
		select {
		case <-l.stopped:
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// containerIDs maps each nginx pod to its container, once all are ready.
func containerIDs(t *testing.T, l *lab.Lab) map[string]string {
	t.Helper()
	out := map[string]string{}
	framework.Eventually(t, 60*time.Second, "3 ready nginx pods", func() error {
		pods, err := l.Client.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{LabelSelector: "app=nginx"})
		if err != nil {
			return err
		}
		clear(out)
		for _, p := range pods.Items {
			if len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].Ready {
				out[p.Name] = p.Status.ContainerStatuses[0].ContainerID
			}
		}
		if len(out) != 3 {
			return fmt.Errorf("%d ready", len(out))
		}
		return nil
	})
	return out
}

// stop lets at least min more requests run, then stops the load.
func (l *load) stop(min int64) (ok, failed int64, firstErr error) {
	target := l.ok.Load() + l.failed.Load() + min
	for l.ok.Load()+l.failed.Load() < target {
		select {
		case <-l.stopped:
			target = 0
		case <-time.After(20 * time.Millisecond):
		}
	}
	close(l.done)
	<-l.stopped
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ok.Load(), l.failed.Load(), l.firstErr
}

// TestNodeReadyFollowsThePodNetwork: a node is Ready only while its
// containerd has netplane's CNI configuration, which the node DaemonSet's
// pod writes. Every node reported NetworkPluginNotReady before the chart
// was installed (the lab records it). Then one node loses its agent pod
// (its kubernetes.io/os label, which the DaemonSet's nodeSelector names,
// is taken away) and its CNI configuration, as a node that has never run
// netplane: it turns NotReady with the runtime's network reason; given
// its label back, the DaemonSet's new pod writes the configuration and the
// node is Ready again. Running pods are not touched.
func TestNodeReadyFollowsThePodNetwork(t *testing.T) {
	l := needReady(t)
	for _, n := range l.Nodes {
		if !strings.Contains(l.Bootstrap[n.Name], "NetworkPluginNotReady") {
			t.Errorf("%s before netplane was installed: %q, want NotReady for NetworkPluginNotReady", n.Name, l.Bootstrap[n.Name])
		}
	}
	n := l.Nodes[len(l.Nodes)-1]
	ctx := ctxFor(t, 3*time.Minute)
	const osLabel = "kubernetes.io/os"
	patch := func(value string) error {
		v := "null"
		if value != "" {
			v = `"` + value + `"`
		}
		_, err := l.Client.CoreV1().Nodes().Patch(ctx, n.Name, types.MergePatchType,
			[]byte(`{"metadata":{"labels":{"`+osLabel+`":`+v+`}}}`), metav1.PatchOptions{})
		return err
	}
	if err := patch(""); err != nil {
		t.Fatal(err)
	}
	relabelled := false
	t.Cleanup(func() {
		if !relabelled {
			patch("linux")
		}
	})
	framework.Eventually(t, time.Minute, "no agent pod on "+n.Name, func() error {
		if pod, err := l.AgentPod(ctx, n.Name); err == nil {
			return fmt.Errorf("%s still runs", pod)
		}
		return nil
	})
	entries, err := os.ReadDir(n.CNIConf)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if err := os.Remove(filepath.Join(n.CNIConf, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	framework.Eventually(t, time.Minute, "NotReady without a CNI configuration", func() error {
		if err := n.Ready(ctx); err == nil || !strings.Contains(err.Error(), "NetworkPluginNotReady") {
			return fmt.Errorf("node %s: %v", n.Name, err)
		}
		return nil
	})
	if err := patch("linux"); err != nil {
		t.Fatal(err)
	}
	relabelled = true
	framework.Eventually(t, time.Minute, "Ready once the agent's new pod writes the CNI configuration", func() error { return n.Ready(ctx) })
	if err := l.WaitRolledOut(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
}

// TestNetplaneRunsOnlyInItsPods: every netplane process of the lab (in one
// of its hosts' network namespaces, or in a lab node's cgroup, as pods
// with a network of their own are) is a container of the chart's pods,
// and none of them was refused anything by the chart's RBAC. Other tests'
// netplane processes on the machine are not the lab's.
func TestNetplaneRunsOnlyInItsPods(t *testing.T) {
	l := needReady(t)
	ctx := ctxFor(t, time.Minute)
	hosts := map[string]bool{}
	for _, ns := range []*netns.NS{l.ControlPlane, l.External, l.Upstream, l.Underlay} {
		hosts[netnsID(t, ns.Path)] = true
	}
	var cgroups []string
	for _, n := range l.Nodes {
		hosts[netnsID(t, n.NS.Path)] = true
		cgroups = append(cgroups, "/"+n.NS.Name+"/")
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	found := 0
	for _, f := range procs {
		cmdline, err := os.ReadFile(f)
		prog := filepath.Base(strings.SplitN(string(cmdline), "\x00", 2)[0])
		// netplane-cni is the plugin containerd runs for a moment.
		if err != nil || prog != "netplane" {
			continue
		}
		cgroup, _ := os.ReadFile(filepath.Join(filepath.Dir(f), "cgroup"))
		net, _ := os.Readlink(filepath.Join(filepath.Dir(f), "ns", "net"))
		if !hosts[net] && !containsAny(string(cgroup), cgroups) {
			continue
		}
		if !strings.Contains(string(cgroup), "kubepods") {
			t.Errorf("%s runs outside a pod (cgroups %s)", strings.ReplaceAll(string(cmdline), "\x00", " "), strings.Fields(string(cgroup)))
			continue
		}
		found++
	}
	pods, err := l.Client.CoreV1().Pods(lab.ReleaseNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=netplane"})
	if err != nil {
		t.Fatal(err)
	}
	// Each node's agent, two controllers and two DNS servers.
	if want := len(l.Nodes) + 4; found < want || len(pods.Items) != want {
		t.Errorf("%d netplane processes in %d pods, want %d of each", found, len(pods.Items), want)
	}
	for _, p := range pods.Items {
		log, err := l.Client.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(log), "\n") {
			if strings.Contains(line, "forbidden") {
				t.Errorf("%s was refused something by RBAC: %s", p.Name, line)
			}
		}
	}
}

// netnsID is a network namespace as /proc/PID/ns/net names it.
func netnsID(t *testing.T, path string) string {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("net:[%d]", st.Ino)
}

func containsAny(s string, subs []string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}
