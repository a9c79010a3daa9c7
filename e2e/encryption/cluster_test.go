package encryption

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
	"github.com/netplane/netplane/podnet"
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
	t      testing.TB
	s      *framework.APIServer
	ctx    context.Context
	router *netns.NS
	nodes  []*node
}

type node struct {
	name, ip   string
	subnet     string // the router's interface of its subnet, for captures
	ns         *netns.NS
	dir        string
	kubeconfig string
	proc       *framework.Process
	metrics    string // address of the metrics server inside ns
	pod        *pod
}

type pod struct {
	name     string
	ns       *netns.NS
	ip, ip6  string
	nodeName string
}

func (n *node) confDir() string { return filepath.Join(n.dir, "net.d") }
func (n *node) binDir() string  { return filepath.Join(n.dir, "bin") }
func (n *node) keyFile() string { return filepath.Join(n.dir, "wireguard", "private.key") }

// podCIDR is node i's IPv4 pod CIDR.
func podCIDR(i int) string { return fmt.Sprintf("10.244.%d.0/24", i) }

func newCluster(t testing.TB, count int, encryption string) *cluster {
	framework.RequireRoot(t)
	_, err := os.Stat("/proc/sys/net/bridge")
	framework.Require(t, err == nil, "br_netfilter is not loaded (modprobe br_netfilter)")
	s := framework.StartAPIServer(t, framework.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	t.Cleanup(cancel)
	c := &cluster{t: t, s: s, ctx: ctx, router: netns.New(t, "wg-router")}
	c.router.Sysctl(t, "net.ipv4.ip_forward", "1")
	c.router.Bridge(t, "br-a")
	c.router.Addr(t, "br-a", "192.168.1.1/24")
	for i := 1; i <= count; i++ {
		c.nodes = append(c.nodes, c.addNode(i))
	}
	for _, n := range c.nodes {
		c.run(n, encryption)
	}
	for _, n := range c.nodes {
		c.waitForCNI(n)
		n.pod = c.addPod(n)
	}
	return c
}

// addNode makes node i's namespace, on subnet A when i is odd, else B,
// and its Node object.
func (c *cluster) addNode(i int) *node {
	t := c.t
	n := &node{name: fmt.Sprintf("node%d", i), dir: t.TempDir()}
	gw := "192.168.1.1"
	if i%2 == 1 {
		n.ip, n.subnet = fmt.Sprintf("192.168.1.%d", i/2+2), "to-"+n.name
		n.ns = netns.Host(t, n.name, c.router, n.subnet, "eth0")
		c.router.Attach(t, n.subnet, "br-a")
	} else {
		n.ip, n.subnet, gw = fmt.Sprintf("192.168.%d.2", i), "to-"+n.name, fmt.Sprintf("192.168.%d.1", i)
		n.ns = netns.Host(t, n.name, c.router, n.subnet, "eth0")
		c.router.Addr(t, n.subnet, gw+"/24")
	}
	n.ns.Addr(t, "eth0", n.ip+"/24")
	n.ns.Route(t, "default", "via", gw)
	cidrs := []string{podCIDR(i), fmt.Sprintf("fd00:10:244:%d::/64", i)}
	obj := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name}, Spec: v1.NodeSpec{PodCIDR: cidrs[0], PodCIDRs: cidrs}}
	c.createNode(obj, n.ip)
	fwd := n.ns.Forward(t, "127.0.0.1:0", strings.TrimPrefix(c.s.URL, "https://"))
	n.kubeconfig = filepath.Join(n.dir, "kubeconfig")
	if err := c.s.WriteKubeconfig(n.kubeconfig, "https://"+fwd, c.s.Token); err != nil {
		t.Fatal(err)
	}
	return n
}

// createNode writes a Node with its InternalIP.
func (c *cluster) createNode(obj *v1.Node, ip string) {
	created, err := c.s.Client.CoreV1().Nodes().Create(c.ctx, obj, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	created.Status.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: ip}}
	if _, err := c.s.Client.CoreV1().Nodes().UpdateStatus(c.ctx, created, metav1.UpdateOptions{}); err != nil {
		c.t.Fatal(err)
	}
}

// run starts netplane on n with encryption mode and extra flags.
func (c *cluster) run(n *node, encryption string, extra ...string) {
	args := []string{"--role=node", "--kubeconfig=" + n.kubeconfig, "--node-name=" + n.name,
		"--cni-conf-dir=" + n.confDir(), "--cni-bin-dir=" + n.binDir(), "--ipam-state-dir=" + filepath.Join(n.dir, "ipam"),
		"--cluster-cidr=10.244.0.0/16,fd00:10:244::/48", "--service-cidrs=10.96.0.0/16,fd00:10:96::/112",
		"--sync-period=" + syncPeriod.String(), "--encryption=" + encryption,
		"--wireguard-implementation=userspace", "--wireguard-private-key-file=" + n.keyFile(),
		"--health-bind-address=127.0.0.1:0", "--metrics-bind-address=127.0.0.1:0", "--v=2"}
	args = append(args, extra...)
	n.proc = n.ns.Start(c.t, filepath.Join(framework.NetplaneBinaries(c.t), "netplane"), args...)
	_, n.metrics = framework.ServedAddresses(c.t, n.proc, 60*time.Second)
}

// restart stops netplane on n (SIGTERM) and starts it again with mode.
func (c *cluster) restart(n *node, encryption string, extra ...string) {
	n.proc.Stop(10 * time.Second)
	c.run(n, encryption, extra...)
}

func (c *cluster) waitForCNI(n *node) {
	framework.Eventually(c.t, 60*time.Second, "conflist and plugin on "+n.name, func() error {
		if n.proc.Exited() {
			c.t.Fatalf("netplane on %s exited:\n%s", n.name, n.proc.Tail(30))
		}
		for _, f := range []string{filepath.Join(n.confDir(), podnet.ConflistName), filepath.Join(n.binDir(), "netplane-cni")} {
			if _, err := os.Stat(f); err != nil {
				return err
			}
		}
		return nil
	})
}

// addPod makes a pod on n through the CNI plugin the node installed, as a
// runtime would, with its echo servers.
func (c *cluster) addPod(n *node) *pod {
	t := c.t
	p := &pod{name: "pod-" + n.name, ns: netns.New(t, "pod"), nodeName: n.name}
	list, err := libcni.ConfListFromFile(filepath.Join(n.confDir(), podnet.ConflistName))
	if err != nil {
		t.Fatal(err)
	}
	cni := libcni.NewCNIConfigWithCacheDir([]string{n.binDir()}, filepath.Join(n.dir, "cache"), nil)
	rt := &libcni.RuntimeConf{ContainerID: p.name, NetNS: p.ns.Path, IfName: "eth0"}
	var res *current.Result
	err = n.ns.Do(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		raw, err := cni.AddNetworkList(ctx, list, rt)
		if err == nil {
			res, err = current.NewResultFromResult(raw)
		}
		return err
	})
	if err != nil || len(res.IPs) != 2 {
		t.Fatalf("ADD %s on %s: %v (%v)", p.name, n.name, err, res)
	}
	p.ip, p.ip6 = res.IPs[0].Address.IP.String(), res.IPs[1].Address.IP.String()
	p.ns.ServeEcho(t, ":"+echoPort, p.name)
	c.writePod(p)
	return p
}

// writePod writes the pod's API object with its addresses, as a kubelet
// would: NetworkPolicy selects pods by it.
func (c *cluster) writePod(p *pod) {
	obj := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: p.name, Labels: map[string]string{"app": p.name}},
		Spec: v1.PodSpec{NodeName: p.nodeName, Containers: []v1.Container{{Name: "echo", Image: "registry.invalid/none"}}}}
	got, err := c.s.Client.CoreV1().Pods("default").Create(c.ctx, obj, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	got.Status = v1.PodStatus{Phase: v1.PodRunning, PodIP: p.ip, PodIPs: []v1.PodIP{{IP: p.ip}, {IP: p.ip6}}}
	if _, err := c.s.Client.CoreV1().Pods("default").UpdateStatus(c.ctx, got, metav1.UpdateOptions{}); err != nil {
		c.t.Fatal(err)
	}
}

func at(ip string) string { return net.JoinHostPort(ip, echoPort) }

// metric is the value of the first sample of name whose labels contain
// labels (`reason="no-key"`), scraped from n's metrics server.
func (n *node) metric(name, labels string) (float64, error) {
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DialContext: func(_ context.Context, network, addr string) (net.Conn, error) { return n.ns.Dial(network, addr) }}}
	code, body, err := framework.HTTPGet(client, "http://"+n.metrics+"/metrics")
	if err != nil || code != http.StatusOK {
		return 0, fmt.Errorf("scrape %s: %d %v", n.name, code, err)
	}
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `(\{[^}]*\})? (\S+)$`)
	for _, m := range re.FindAllStringSubmatch(body, -1) {
		if strings.Contains(m[1], labels) {
			return strconv.ParseFloat(m[2], 64)
		}
	}
	return 0, fmt.Errorf("%s{%s} not among %s's metrics", name, labels, n.name)
}

// key is n's published WireGuard public key.
func (c *cluster) key(name string) string {
	obj, err := c.s.Client.CoreV1().Nodes().Get(c.ctx, name, metav1.GetOptions{})
	if err != nil {
		return ""
	}
	return obj.Annotations[wireguard.Annotation]
}
