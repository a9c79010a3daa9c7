package policy

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"golang.org/x/sync/errgroup"
	v1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/netplane/netplane/e2e/framework"
)

// The API objects of BenchmarkPolicyAgainstKubeRouter. Nothing runs the
// pods: the harness writes each one's status (phase, podIPs, hostIP) as a
// kubelet would. The cluster is the one of BenchmarkFullBuild (bench_test.go):
// namespaces ns-<i> of 100 pods each (labels app, tier, pod-template-hash;
// named ports http, metrics, dns), spread round-robin over 100 nodes
// node-<k> whose pod CIDRs are 10.244.<k>.0/24, and at a scale of N
// policies the first N/10 namespaces hold scalePolicy's 10 (a default deny,
// same-namespace ingress, DNS and database egress, an ipBlock, ingress from
// other teams' namespaces by named port and port range).
//
// Beside them, three namespaces hold the probe pods, which are real network
// namespaces (vsNodes): bench-client (on node-1) and bench-server (on
// node-2), isolated by vsProbePolicies at every scale but 0, and
// bench-open, which no policy ever selects.

// The two nodes that exist as network namespaces; the other 98 exist only
// as the nodeName and hostIP of their pods.
const (
	vsClientNode = 1
	vsServerNode = 2
	vsNodes      = 100
	vsPodsPerNS  = 100
)

func vsNodeName(k int) string { return fmt.Sprintf("node-%d", k) }
func vsNodeIP(k int) string   { return fmt.Sprintf("192.168.90.%d", 10+k) }

// Probe pod addresses. The client pod's namespace holds all of
// 10.244.1.128/25: its own address, and those of the pods the label and
// creation samples write (vsMaxSamples of each).
const (
	vsClientIP     = "10.244.1.130"
	vsServerIP     = "10.244.2.130"
	vsOpenClientIP = "10.244.1.120"
	vsOpenServerIP = "10.244.2.120"
	vsClientRange  = "10.244.1.128/25"
	vsMaxSamples   = 40
	vsAllowedPort  = 8080 // allowed from bench-client's app=client pods
	vsGrantedPort  = 8081 // allowed from bench-client's access=granted pods
	vsDeniedPort   = 8082 // never allowed
	vsSamplePort0  = 9000 // sample i's new policy allows vsSamplePort0+i
)

func vsLabelSampleIP(i int) string  { return fmt.Sprintf("10.244.1.%d", 140+i) }
func vsCreateSampleIP(i int) string { return fmt.Sprintf("10.244.1.%d", 180+i) }

// vsCluster writes the objects, with a client of its own for bulk writes.
type vsCluster struct {
	api      *framework.APIServer
	writer   kubernetes.Interface
	policies int // scale policies now in the API server
}

func newVSCluster(b *testing.B, api *framework.APIServer) *vsCluster {
	cfg := rest.CopyConfig(api.RestConfig)
	cfg.QPS, cfg.Burst = 5000, 5000
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	w, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	return &vsCluster{api: api, writer: w}
}

// vsParallel runs fn(0..n-1) on 32 writers and fails on the first error.
func vsParallel(b *testing.B, n int, fn func(ctx context.Context, i int) error) {
	var g errgroup.Group
	g.SetLimit(32)
	for i := range n {
		g.Go(func() error { return vsCall(func(ctx context.Context) error { return fn(ctx, i) }) })
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
}

// populate writes the two Nodes, the namespaces, pods pods and the probe
// pods; no policy yet.
func (c *vsCluster) populate(b *testing.B, pods int) {
	ctx := framework.Ctx(b)
	for _, k := range []int{vsClientNode, vsServerNode} {
		cidr := fmt.Sprintf("10.244.%d.0/24", k)
		n, err := c.writer.CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: vsNodeName(k)},
			Spec: v1.NodeSpec{PodCIDR: cidr, PodCIDRs: []string{cidr}}}, metav1.CreateOptions{})
		if err != nil {
			b.Fatal(err)
		}
		n.Status.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: vsNodeIP(k)}}
		if _, err := c.writer.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	nss := pods / vsPodsPerNS
	vsParallel(b, nss, func(ctx context.Context, i int) error {
		name := fmt.Sprintf("ns-%d", i)
		_, err := c.writer.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name,
			Labels: map[string]string{"team": fmt.Sprintf("team-%d", i%10), "env": []string{"prod", "dev"}[i%2]}}}, metav1.CreateOptions{})
		return err
	})
	for _, name := range []string{"bench-client", "bench-server", "bench-open"} {
		if _, err := c.writer.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	vsParallel(b, nss*vsPodsPerNS, func(ctx context.Context, n int) error {
		return c.createPod(ctx, vsScalePod(n))
	})
	probes := []*v1.Pod{
		vsPod("bench-client", "client", vsClientNode, vsClientIP, map[string]string{"app": "client"}),
		vsPod("bench-server", "server", vsServerNode, vsServerIP, map[string]string{"app": "server"}),
		vsPod("bench-open", "client", vsClientNode, vsOpenClientIP, map[string]string{"app": "client"}),
		vsPod("bench-open", "server", vsServerNode, vsOpenServerIP, map[string]string{"app": "server"}),
	}
	for i := range vsMaxSamples {
		probes = append(probes, vsLabelSamplePod(i))
	}
	vsParallel(b, len(probes), func(ctx context.Context, i int) error { return c.createPod(ctx, probes[i]) })
}

// createPod creates p and then writes its status, as the kubelet reports
// a started pod.
func (c *vsCluster) createPod(ctx context.Context, p *v1.Pod) error {
	status := p.Status
	created, err := c.writer.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	created.Status = status
	_, err = c.writer.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{})
	return err
}

// vsScalePod is pod n of the cluster: pod n%100 of namespace ns-<n/100>,
// on node n%100, with address 10.244.<node>.<2+n/100>.
func vsScalePod(n int) *v1.Pod {
	j, k := n%vsPodsPerNS, n%vsNodes
	labels := map[string]string{"app": fmt.Sprintf("app-%d", j%10), "tier": []string{"fe", "be", "db"}[j%3], "pod-template-hash": fmt.Sprintf("h%d", j%20)}
	p := vsPod(fmt.Sprintf("ns-%d", n/vsPodsPerNS), fmt.Sprintf("pod-%d", j), k, fmt.Sprintf("10.244.%d.%d", k, 2+n/vsNodes), labels)
	p.Spec.Containers[0].Ports = []v1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: v1.ProtocolTCP},
		{Name: "metrics", ContainerPort: 9090, Protocol: v1.ProtocolTCP}, {Name: "dns", ContainerPort: 53, Protocol: v1.ProtocolUDP}}
	return p
}

// vsLabelSamplePod is the pod whose label sample i grants access.
func vsLabelSamplePod(i int) *v1.Pod {
	return vsPod("bench-client", fmt.Sprintf("label-%d", i), vsClientNode, vsLabelSampleIP(i), map[string]string{"app": "labelled"})
}

// vsCreateSamplePod is the pod creation sample i creates.
func vsCreateSamplePod(i int) *v1.Pod {
	return vsPod("bench-client", fmt.Sprintf("created-%d", i), vsClientNode, vsCreateSampleIP(i), map[string]string{"app": "client"})
}

func vsPod(ns, name string, node int, ip string, labels map[string]string) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: v1.PodSpec{NodeName: vsNodeName(node), Containers: []v1.Container{{Name: "c", Image: "registry.invalid/none",
			Ports: []v1.ContainerPort{{Name: "http", ContainerPort: vsAllowedPort, Protocol: v1.ProtocolTCP}}}}},
		Status: v1.PodStatus{Phase: v1.PodRunning, PodIP: ip, PodIPs: []v1.PodIP{{IP: ip}},
			HostIP: vsNodeIP(node), HostIPs: []v1.HostIP{{IP: vsNodeIP(node)}}},
	}
}

// vsProbePolicies isolate the probe pods both ways: bench-server admits
// bench-client's app=client pods on vsAllowedPort and its access=granted
// pods on vsGrantedPort; bench-client may reach bench-server on any port.
func vsProbePolicies() []*netv1.NetworkPolicy {
	fromClients := func(key, value string) netv1.NetworkPolicyPeer {
		return bothPeer(sel("kubernetes.io/metadata.name", "bench-client"), sel(key, value))
	}
	return []*netv1.NetworkPolicy{
		policy("bench-server", "default-deny", netv1.NetworkPolicySpec{PodSelector: *all, PolicyTypes: bothTypes}),
		policy("bench-server", "allow-client", netv1.NetworkPolicySpec{PodSelector: *sel("app", "server"),
			Ingress: []netv1.NetworkPolicyIngressRule{ingress(peers(fromClients("app", "client")), port(tcp, vsAllowedPort))}}),
		policy("bench-server", "allow-granted", netv1.NetworkPolicySpec{PodSelector: *sel("app", "server"),
			Ingress: []netv1.NetworkPolicyIngressRule{ingress(peers(fromClients("access", "granted")), port(tcp, vsGrantedPort))}}),
		policy("bench-client", "default-deny", netv1.NetworkPolicySpec{PodSelector: *all, PolicyTypes: bothTypes}),
		policy("bench-client", "allow-to-server", netv1.NetworkPolicySpec{PodSelector: *all, PolicyTypes: egressOnly,
			Egress: []netv1.NetworkPolicyEgressRule{egress(peers(nsPeer(sel("kubernetes.io/metadata.name", "bench-server"))))}}),
	}
}

// vsSamplePolicy is what policy creation sample i creates: bench-client's
// app=client pods admitted on vsSamplePort0+i.
func vsSamplePolicy(i int) *netv1.NetworkPolicy {
	return policy("bench-server", fmt.Sprintf("allow-port-%d", i), netv1.NetworkPolicySpec{PodSelector: *sel("app", "server"),
		Ingress: []netv1.NetworkPolicyIngressRule{ingress(peers(bothPeer(sel("kubernetes.io/metadata.name", "bench-client"), sel("app", "client"))),
			port(tcp, int32(vsSamplePort0+i)))}})
}

// setPolicies makes the scale n: the first n/10 namespaces hold their 10
// policies and the rest none; the probe policies exist when n > 0.
func (c *vsCluster) setPolicies(b *testing.B, n int) {
	nss := n / 10
	have := c.policies / 10
	vsParallel(b, max(nss, have)*10, func(ctx context.Context, x int) error {
		i, k := x/10, x%10
		np := scalePolicy(fmt.Sprintf("ns-%d", i), i, k)
		switch {
		case i < nss && i >= have:
			_, err := c.writer.NetworkingV1().NetworkPolicies(np.Namespace).Create(ctx, np, metav1.CreateOptions{})
			return err
		case i >= nss && i < have:
			return c.writer.NetworkingV1().NetworkPolicies(np.Namespace).Delete(ctx, np.Name, metav1.DeleteOptions{})
		}
		return nil
	})
	ctx := framework.Ctx(b)
	for _, np := range vsProbePolicies() {
		var err error
		switch {
		case n > 0 && c.policies == 0:
			_, err = c.writer.NetworkingV1().NetworkPolicies(np.Namespace).Create(ctx, np, metav1.CreateOptions{})
		case n == 0 && c.policies > 0:
			err = c.writer.NetworkingV1().NetworkPolicies(np.Namespace).Delete(ctx, np.Name, metav1.DeleteOptions{})
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	c.policies = n
}

// A sample kind is one change users make: an untimed preparation, the
// timed write, and the connection that the change allows, from the client
// pod's namespace bound to src, to the server pod's port.
type vsChange struct {
	kind    string
	prepare func(ctx context.Context, c *vsCluster, i int) error // nil: none
	write   func(ctx context.Context, c *vsCluster, i int) error
	undo    func(ctx context.Context, c *vsCluster, i int) error
	src     func(i int) string
	port    func(i int) int
}

var vsChanges = []vsChange{
	{
		kind: "policy created",
		write: func(ctx context.Context, c *vsCluster, i int) error {
			_, err := c.writer.NetworkingV1().NetworkPolicies("bench-server").Create(ctx, vsSamplePolicy(i), metav1.CreateOptions{})
			return err
		},
		undo: func(ctx context.Context, c *vsCluster, i int) error {
			return c.writer.NetworkingV1().NetworkPolicies("bench-server").Delete(ctx, vsSamplePolicy(i).Name, metav1.DeleteOptions{})
		},
		src:  func(int) string { return vsClientIP },
		port: func(i int) int { return vsSamplePort0 + i },
	},
	{
		kind: "pod label changed",
		write: func(ctx context.Context, c *vsCluster, i int) error {
			return c.patchPod(ctx, vsLabelSamplePod(i).Name, `{"metadata":{"labels":{"access":"granted"}}}`, "")
		},
		undo: func(ctx context.Context, c *vsCluster, i int) error {
			return c.patchPod(ctx, vsLabelSamplePod(i).Name, `{"metadata":{"labels":{"access":null}}}`, "")
		},
		src:  vsLabelSampleIP,
		port: func(int) int { return vsGrantedPort },
	},
	{
		// The pod is created without an address, as a kubelet's pod is; the
		// sample times the status write that reports the address, which is
		// what both enforcers act on.
		kind: "pod created",
		prepare: func(ctx context.Context, c *vsCluster, i int) error {
			p := vsCreateSamplePod(i)
			p.Status = v1.PodStatus{}
			_, err := c.writer.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
			return err
		},
		write: func(ctx context.Context, c *vsCluster, i int) error {
			p := vsCreateSamplePod(i)
			status, err := json.Marshal(map[string]any{"status": p.Status})
			if err != nil {
				return err
			}
			return c.patchPod(ctx, p.Name, string(status), "status")
		},
		undo: func(ctx context.Context, c *vsCluster, i int) error {
			zero := int64(0)
			return c.writer.CoreV1().Pods("bench-client").Delete(ctx, vsCreateSamplePod(i).Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		},
		src:  vsCreateSampleIP,
		port: func(int) int { return vsAllowedPort },
	},
}

// patchPod merge-patches a pod of bench-client (its subresource, if given).
func (c *vsCluster) patchPod(ctx context.Context, name, patch, subresource string) error {
	var sub []string
	if subresource != "" {
		sub = []string{subresource}
	}
	_, err := c.writer.CoreV1().Pods("bench-client").Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}, sub...)
	return err
}
