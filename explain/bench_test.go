package explain

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/netplane/netplane/e2e/framework"
)

// BenchmarkExplain answers questions against a real API server holding
// 10,000 pods (with addresses) in 20 namespaces, 1,000 NetworkPolicies
// (50 per namespace, selecting by label, allowing by namespace and pod
// selectors, named ports and ipBlocks), 20 nodes and a Service of 20
// endpoints per namespace: the whole `netplane explain` off any node,
// API reads included. The bound is 1 s per answer.
func BenchmarkExplain(b *testing.B) {
	const (
		namespaces  = 20
		podsPerNS   = 500
		polsPerNS   = 50
		nodes       = 20
		endpointsNS = 20
	)
	s := framework.StartAPIServer(b, framework.Options{})
	rc := *s.RestConfig
	rc.QPS, rc.Burst = 5000, 5000
	c, err := kubernetes.NewForConfig(&rc)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	start := time.Now()
	for i := range nodes {
		n := node(fmt.Sprintf("n%d", i), fmt.Sprintf("192.168.1.%d", i+1), fmt.Sprintf("10.%d.%d.0/24", 100+i/200, i%200), fmt.Sprintf("z%d", i%3))
		created, err := c.CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: n.ObjectMeta, Spec: n.Spec}, metav1.CreateOptions{})
		if err != nil {
			b.Fatal(err)
		}
		created.Status = n.Status
		if _, err := c.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	type job func() error
	jobs := make(chan job)
	var wg sync.WaitGroup
	var failed atomic.Value
	for range 48 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				if err := j(); err != nil {
					failed.Store(err)
				}
			}
		}()
	}
	for ns := range namespaces {
		name := fmt.Sprintf("ns%d", ns)
		if _, err := c.CoreV1().Namespaces().Create(ctx, namespace(name, map[string]string{"team": fmt.Sprint(ns % 4)}), metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	for ns := range namespaces {
		name := fmt.Sprintf("ns%d", ns)
		for i := range podsPerNS {
			p := pod(name, fmt.Sprintf("p%d", i), fmt.Sprintf("n%d", i%nodes), fmt.Sprintf("10.%d.%d.%d", 100+(i%nodes)/200, (i%nodes)%200, 2+ns*12+i/nodes%12),
				map[string]string{"app": fmt.Sprintf("app%d", i%endpointsNS), "tier": fmt.Sprint(i % 5)},
				v1.ContainerPort{Name: "http", ContainerPort: 8080, Protocol: v1.ProtocolTCP})
			if i >= endpointsNS { // beyond the Service's pods, addresses need not be unique per node
				p.Status.PodIP = fmt.Sprintf("10.%d.%d.%d", 200+ns, i/250, i%250)
				p.Status.PodIPs = []v1.PodIP{{IP: p.Status.PodIP}}
			}
			jobs <- func() error {
				created, err := c.CoreV1().Pods(name).Create(ctx, &v1.Pod{ObjectMeta: p.ObjectMeta, Spec: p.Spec}, metav1.CreateOptions{})
				if err != nil {
					return err
				}
				created.Status = p.Status
				_, err = c.CoreV1().Pods(name).UpdateStatus(ctx, created, metav1.UpdateOptions{})
				return err
			}
		}
		for i := range polsPerNS {
			np := netpol(name, fmt.Sprintf("pol%d", i), map[string]string{"tier": fmt.Sprint(i % 5)}, nil,
				[]netv1.NetworkPolicyIngressRule{
					{From: []netv1.NetworkPolicyPeer{fromNamespaces(map[string]string{"team": fmt.Sprint(i % 4)})}, Ports: []netv1.NetworkPolicyPort{tcp(intstr.FromString("http"))}},
					{From: []netv1.NetworkPolicyPeer{fromPods(map[string]string{"app": fmt.Sprintf("app%d", i%endpointsNS)})}},
					{From: []netv1.NetworkPolicyPeer{{IPBlock: &netv1.IPBlock{CIDR: "172.16.0.0/12", Except: []string{fmt.Sprintf("172.16.%d.0/24", i)}}}}},
				}, nil)
			jobs <- func() error {
				_, err := c.NetworkingV1().NetworkPolicies(name).Create(ctx, np, metav1.CreateOptions{})
				return err
			}
		}
		svc := service(name, "web", fmt.Sprintf("10.96.%d.10", ns), svcPort("http", 80, 8080))
		svc.Spec.Selector = map[string]string{"tier": "0"}
		jobs <- func() error {
			created, err := c.CoreV1().Services(name).Create(ctx, svc, metav1.CreateOptions{})
			if err != nil {
				return err
			}
			var eps []ep
			for i := range endpointsNS {
				p := pod(name, fmt.Sprintf("p%d", i), fmt.Sprintf("n%d", i%nodes), fmt.Sprintf("10.%d.%d.%d", 100+(i%nodes)/200, (i%nodes)%200, 2+ns*12+i/nodes%12), nil)
				eps = append(eps, ready(p))
			}
			_, err = c.DiscoveryV1().EndpointSlices(name).Create(ctx, slice(created, "http", 8080, eps...), metav1.CreateOptions{})
			return err
		}
	}
	close(jobs)
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	b.Logf("loaded %d pods, %d policies, %d nodes in %s (load %s)", namespaces*podsPerNS, namespaces*polsPerNS, nodes, time.Since(start).Round(time.Second), framework.LoadAverage())

	// The command as a user runs it: a process, its client, its answer.
	bin := filepath.Join(framework.NetplaneBinaries(b), "netplane")
	b.Run("command", func(b *testing.B) {
		var worst time.Duration
		for b.Loop() {
			t0 := time.Now()
			out, err := exec.Command(bin, "explain", "--kubeconfig="+s.Kubeconfig, "--from=ns3/p7", "--to=svc/ns5/web").CombinedOutput()
			if err != nil || !strings.Contains(string(out), "Verdict: ") {
				b.Fatalf("%v: %s", err, out)
			}
			worst = max(worst, time.Since(t0))
		}
		b.ReportMetric(float64(worst.Milliseconds()), "worst-ms")
		b.Logf("command: worst %s of %d (load %s)", worst, b.N, framework.LoadAverage())
		if worst > time.Second {
			b.Errorf("an answer took %s, over 1 s", worst)
		}
	})
	for _, q := range []struct {
		name string
		q    Question
	}{
		{"service", Question{From: "ns3/p7", To: "svc/ns5/web", Namespace: "default"}},
		{"name", Question{From: "ns3/p7", To: "web.ns5", Namespace: "default"}},
		{"pod", Question{From: "ns3/p7", To: "ns5/p3", Port: PortQuery{Name: "http"}, Namespace: "default"}},
		{"pod-address", Question{From: "ns3/p7", To: "10.100.3.62", Port: PortQuery{Number: 8080}, Namespace: "default"}},
	} {
		b.Run(q.name, func(b *testing.B) {
			var worst time.Duration
			for b.Loop() {
				t0 := time.Now()
				x, err := Run(ctx, c, q.q, nil)
				if err != nil {
					b.Fatal(err)
				}
				if len(x.Backends) == 0 || x.Backends[0].Pod == "" || len(x.Backends[0].Policies) == 0 {
					b.Fatalf("no backend pod, or no policy judged it: %s", x.Reason)
				}
				worst = max(worst, time.Since(t0))
			}
			b.ReportMetric(float64(worst.Milliseconds()), "worst-ms")
			b.Logf("%s: worst %s of %d (load %s)", q.name, worst, b.N, framework.LoadAverage())
			if worst > time.Second {
				b.Errorf("an answer took %s, over 1 s", worst)
			}
		})
	}
}
