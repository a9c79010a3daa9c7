package encryption

import (
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netplane/netplane/e2e/testcluster"
	"github.com/netplane/netplane/wireguard"
)

// The cluster: a real kube-apiserver; a router namespace joining two
// subnets, A (192.168.1.0/24, a bridge in the router: node1 at .2 and
// node3 at .3 share it) and B (192.168.2.0/24: node2 at .2); each node
// running `netplane --role=node` in its namespace with pod CIDRs
// 10.244.<i>.0/24 and fd00:10:244:<i>::/64 and one pod made through the
// CNI plugin the node installs, serving the echo servers on 8080.

const (
	echoPort   = "8080"
	syncPeriod = 4 * time.Second
	// marker is sent by the pods; it must never be seen on the underlay.
	marker = "netplane-cleartext-marker-5c1e"
)

type cluster struct {
	*testcluster.Cluster
	t     testing.TB
	nodes []*node
}

type node struct {
	*testcluster.Node
	pod *pod
}

type pod struct {
	*testcluster.Pod
	Name string
}

func (n *node) keyFile() string { return filepath.Join(n.Dir, "wireguard", "private.key") }

func (n *node) agentSocket() string { return filepath.Join(n.Dir, "agent.sock") }

// podCIDR is node i's IPv4 pod CIDR.
func podCIDR(i int) string { return fmt.Sprintf("10.244.%d.0/24", i) }

// newCluster: node i sits on subnet A when i is odd, else on a subnet
// 192.168.<i>.0/24 of its own.
func newCluster(t testing.TB, count int, encryption string) *cluster {
	subnets := []testcluster.Subnet{{V4: "192.168.1.", Bridge: testcluster.InRouter, Gateway: "192.168.1.1", Routed: true}}
	for i := 2; i <= count; i += 2 {
		subnets = append(subnets, testcluster.Subnet{V4: fmt.Sprintf("192.168.%d.", i), Bridge: testcluster.Link,
			Gateway: fmt.Sprintf("192.168.%d.1", i), Routed: true})
	}
	c := &cluster{t: t}
	c.Cluster = testcluster.New(t, testcluster.Options{
		Nodes: count, Subnets: subnets, IPv6: true, NoStart: true,
		Place: func(i int) (int, string) {
			if i%2 == 1 {
				return 0, fmt.Sprint(i/2 + 2)
			}
			return i / 2, "2"
		},
	})
	for _, n := range c.Nodes {
		c.nodes = append(c.nodes, &node{Node: n})
	}
	for _, n := range c.nodes {
		c.run(n, encryption)
	}
	for _, n := range c.nodes {
		c.WaitForCNI(t, n.Node)
		n.pod = c.addPod(n)
	}
	return c
}

// createNode writes a Node with its InternalIP.
func (c *cluster) createNode(obj *v1.Node, ip string) {
	created, err := c.API.Client.CoreV1().Nodes().Create(c.Ctx, obj, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	c.SetAddresses(c.t, created, ip)
}

// run starts netplane on n with encryption mode and extra flags, and waits
// until it serves metrics.
func (c *cluster) run(n *node, encryption string, extra ...string) {
	c.Start(c.t, n.Node, append([]string{"--service-cidrs=10.96.0.0/16,fd00:10:96::/112",
		"--sync-period=" + syncPeriod.String(), "--encryption=" + encryption,
		"--wireguard-implementation=userspace", "--wireguard-private-key-file=" + n.keyFile(),
		"--agent-socket=" + n.agentSocket(), "--v=2"}, extra...)...)
	n.Served(c.t)
}

// restart stops netplane on n (SIGTERM) and starts it again with mode.
func (c *cluster) restart(n *node, encryption string, extra ...string) {
	c.Stop(n.Node)
	c.run(n, encryption, extra...)
}

// addPod makes a pod on n through the CNI plugin the node installed, with
// its echo servers, and its API object: NetworkPolicy selects pods by it.
func (c *cluster) addPod(n *node) *pod {
	p := &pod{Pod: c.AddPod(c.t, n.Node, "pod-"+n.Name), Name: "pod-" + n.Name}
	p.NS.ServeEcho(c.t, ":"+echoPort, p.Name)
	c.WritePod(c.t, &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: p.Name, Labels: map[string]string{"app": p.Name}},
		Spec:   v1.PodSpec{NodeName: n.Name, Containers: []v1.Container{{Name: "echo", Image: "registry.invalid/none"}}},
		Status: testcluster.Running(p.IP, p.IP6)})
	return p
}

func at(ip string) string { return net.JoinHostPort(ip, echoPort) }

// key is n's published WireGuard public key.
func (c *cluster) key(name string) string {
	obj, err := c.API.Client.CoreV1().Nodes().Get(c.Ctx, name, metav1.GetOptions{})
	if err != nil {
		return ""
	}
	return obj.Annotations[wireguard.Annotation]
}
