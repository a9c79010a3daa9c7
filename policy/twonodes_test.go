package policy

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	netv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
	"github.com/netplane/netplane/nft"
	"github.com/netplane/netplane/podnet"
)

// The real thing: two nodes in network namespaces on an underlay, host-gw
// routes between their pod CIDRs, each running `netplane --role=node`
// against a real kube-apiserver; the upstream e2e model's pods (x, y, z ×
// a, b, c) made through the CNI plugin the nodes install, spread over both
// nodes, each serving TCP and UDP (and receiving SCTP on a raw socket) on
// 80 and 81, with named container ports; their API objects written with
// status.podIPs, as the lab's agent does. Each case writes policies and
// objects, then every probe of the truth table is made and compared with
// the API reading (oracle_test.go), and with what the case states itself.

const (
	extIP, extIP6 = "192.168.77.100", "fd00:77::100"
	syncPeriod    = 4 * time.Second // the nodes' --sync-period
)

// e2ePods places the model's pods on the two nodes.
var e2ePods = []struct {
	key  string
	node int
}{{"x/a", 1}, {"x/b", 2}, {"x/c", 1}, {"y/a", 2}, {"y/b", 1}, {"y/c", 2}, {"z/a", 1}, {"z/b", 2}, {"z/c", 1}}

type twoNodes struct {
	// t is the running test or subtest, which helpers fail; root is the
	// suite's, which owns what outlives a subtest (processes, logs).
	t, root *testing.T
	s       *framework.APIServer
	ctx     context.Context
	sw      *netns.NS
	ext     *netns.NS
	nodes   []*tnode
	pods    map[string]*tpod // by "ns/name"
	api     *cluster         // the API objects as the oracle reads them
	sctp    *sctpSeen
	svcIP   string // a ClusterIP whose one backend is x/a:80
	// disabled are the nodes running with --network-policy=false.
	disabled map[string]bool
	last     map[tprobe]bool // what the previous check expected
}

type tnode struct {
	name, ip, ip6 string
	ns            *netns.NS
	dir           string
	proc          *framework.Process
	kubeconfig    string
}

type tpod struct {
	key     string
	node    *tnode
	ns      *netns.NS
	ip, ip6 string
	obj     *v1.Pod
}

func (n *tnode) confDir() string { return filepath.Join(n.dir, "net.d") }
func (n *tnode) binDir() string  { return filepath.Join(n.dir, "bin") }

// newTwoNodes brings the cluster up: API server, underlay, the outside
// host, both nodes, the pods, and a Service for x/a.
func newTwoNodes(t *testing.T) *twoNodes {
	framework.RequireRoot(t)
	_, err := os.Stat("/proc/sys/net/bridge")
	framework.Require(t, err == nil, "br_netfilter is not loaded (modprobe br_netfilter)")
	// Without strict CIDR validation the API server takes "010.0.0.0/8",
	// as it kept objects stored before: a policy that does not compile.
	s := framework.StartAPIServer(t, framework.Options{ExtraArgs: []string{"--feature-gates=StrictIPCIDRValidation=false"}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	t.Cleanup(cancel)
	c := &twoNodes{t: t, root: t, s: s, ctx: ctx, pods: map[string]*tpod{}, api: newCluster(nil, nil),
		disabled: map[string]bool{}, sctp: newSCTPSeen()}
	c.sw = netns.New(t, "underlay")
	c.sw.Bridge(t, "br0")
	c.ext = netns.Host(t, "ext", c.sw, "u-ext", "eth0")
	c.sw.Attach(t, "u-ext", "br0")
	c.ext.Addr(t, "eth0", extIP+"/24")
	c.ext.Addr(t, "eth0", extIP6+"/64")
	for i := 1; i <= 2; i++ {
		c.nodes = append(c.nodes, c.startNode(i))
		c.ext.Route(t, fmt.Sprintf("10.244.%d.0/24", i), "via", fmt.Sprintf("192.168.77.1%d", i))
		c.ext.Route(t, fmt.Sprintf("fd00:10:244:%d::/64", i), "via", fmt.Sprintf("fd00:77::1%d", i))
	}
	serve(t, c.ext, ":80")
	serve(t, c.ext, ":81")
	for _, n := range c.nodes {
		c.waitForCNI(n)
	}
	for _, ns := range modelNamespaces {
		obj := modelNamespace(ns)
		if _, err := s.Client.CoreV1().Namespaces().Create(c.ctx, obj, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		c.api.setNamespace(obj)
	}
	for _, p := range e2ePods {
		c.addPod(p.key, c.nodes[p.node-1])
	}
	c.addService()
	return c
}

// startNode makes node i (1, 2) at 192.168.77.1<i> and fd00:77::1<i>
// with pod CIDRs 10.244.<i>.0/24 and fd00:10:244:<i>::/64, and runs
// netplane there.
func (c *twoNodes) startNode(i int) *tnode {
	t := c.t
	n := &tnode{name: fmt.Sprintf("node%d", i), ip: fmt.Sprintf("192.168.77.1%d", i), ip6: fmt.Sprintf("fd00:77::1%d", i), dir: t.TempDir()}
	n.ns = netns.Host(t, n.name, c.sw, "u-"+n.name, "eth0")
	c.sw.Attach(t, "u-"+n.name, "br0")
	n.ns.Addr(t, "eth0", n.ip+"/24")
	n.ns.Addr(t, "eth0", n.ip6+"/64")
	n.ns.Route(t, "default", "via", extIP)
	cidrs := []string{fmt.Sprintf("10.244.%d.0/24", i), fmt.Sprintf("fd00:10:244:%d::/64", i)}
	obj := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name}, Spec: v1.NodeSpec{PodCIDR: cidrs[0], PodCIDRs: cidrs}}
	created, err := c.s.Client.CoreV1().Nodes().Create(c.ctx, obj, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	created.Status.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: n.ip}, {Type: v1.NodeInternalIP, Address: n.ip6}}
	if _, err := c.s.Client.CoreV1().Nodes().UpdateStatus(c.ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	fwd := n.ns.Forward(t, "127.0.0.1:0", strings.TrimPrefix(c.s.URL, "https://"))
	n.kubeconfig = filepath.Join(n.dir, "kubeconfig")
	if err := c.s.WriteKubeconfig(n.kubeconfig, "https://"+fwd, c.s.Token); err != nil {
		t.Fatal(err)
	}
	c.run(n)
	return n
}

// run starts netplane on n with the suite's flags and extra.
func (c *twoNodes) run(n *tnode, extra ...string) {
	args := append([]string{"--role=node", "--kubeconfig=" + n.kubeconfig, "--node-name=" + n.name,
		"--cni-conf-dir=" + n.confDir(), "--cni-bin-dir=" + n.binDir(), "--ipam-state-dir=" + filepath.Join(n.dir, "ipam"),
		"--cluster-cidr=10.244.0.0/16,fd00:10:244::/48", "--service-cidrs=10.96.0.0/16,fd00:10:96::/112",
		"--sync-period=" + syncPeriod.String(), "--network-policy-log-denied",
		"--health-bind-address=127.0.0.1:0", "--metrics-bind-address=127.0.0.1:0", "--v=2"}, extra...)
	n.proc = n.ns.Start(c.root, filepath.Join(framework.NetplaneBinaries(c.t), "netplane"), args...)
}

func (c *twoNodes) waitForCNI(n *tnode) {
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

// addPod makes pod key ("ns/name") on n: its namespace through the CNI
// plugin the node installed, as a runtime would, its servers, and its API
// object with the addresses the plugin gave.
func (c *twoNodes) addPod(key string, n *tnode) *tpod {
	t := c.t
	p := &tpod{key: key, node: n, ns: netns.New(t, "pod")}
	list, err := libcni.ConfListFromFile(filepath.Join(n.confDir(), podnet.ConflistName))
	if err != nil {
		t.Fatal(err)
	}
	cni := libcni.NewCNIConfigWithCacheDir([]string{n.binDir()}, filepath.Join(n.dir, "cache"), nil)
	rt := &libcni.RuntimeConf{ContainerID: strings.ReplaceAll(key, "/", "-"), NetNS: p.ns.Path, IfName: "eth0"}
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
		t.Fatalf("ADD %s on %s: %v (%v)", key, n.name, err, res)
	}
	p.ip, p.ip6 = res.IPs[0].Address.IP.String(), res.IPs[1].Address.IP.String()
	for _, port := range []string{":80", ":81"} {
		serve(t, p.ns, port)
	}
	c.sctp.listen(t, p.ns)
	ns, name, _ := strings.Cut(key, "/")
	obj := modelPod(ns, name)
	if key == "z/c" { // a pod whose named ports are not its neighbours'
		obj.Spec.Containers[0].Ports[0].Name, obj.Spec.Containers[3].Ports[0].Name = "serve-81-tcp", "serve-80-tcp"
	}
	for i := range obj.Spec.Containers {
		obj.Spec.Containers[i].Image = "registry.invalid/none"
	}
	obj.Spec.NodeName = n.name
	obj.Status = v1.PodStatus{Phase: v1.PodRunning, PodIP: p.ip, PodIPs: []v1.PodIP{{IP: p.ip}, {IP: p.ip6}}}
	p.obj = c.writePod(obj)
	c.pods[key] = p
	return p
}

// writePod creates or updates a pod and its status, and tells the oracle.
func (c *twoNodes) writePod(obj *v1.Pod) *v1.Pod {
	pods := c.s.Client.CoreV1().Pods(obj.Namespace)
	got, err := pods.Get(c.ctx, obj.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		got, err = pods.Create(c.ctx, obj, metav1.CreateOptions{})
	case err == nil:
		got.Labels = obj.Labels
		got, err = pods.Update(c.ctx, got, metav1.UpdateOptions{})
	}
	if err != nil {
		c.t.Fatal(err)
	}
	got.Status = obj.Status
	if got, err = pods.UpdateStatus(c.ctx, got, metav1.UpdateOptions{}); err != nil {
		c.t.Fatal(err)
	}
	c.api.setPod(got)
	return got
}

func (c *twoNodes) deletePod(key string) {
	p := c.pods[key]
	if err := c.s.Client.CoreV1().Pods(p.obj.Namespace).Delete(c.ctx, p.obj.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		c.t.Fatal(err)
	}
	c.api.deletePod(types.NamespacedName{Namespace: p.obj.Namespace, Name: p.obj.Name})
	delete(c.pods, key)
}

func (c *twoNodes) setNamespaceLabels(name string, labels map[string]string) {
	ns, err := c.s.Client.CoreV1().Namespaces().Get(c.ctx, name, metav1.GetOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	ns.Labels = labels
	if ns, err = c.s.Client.CoreV1().Namespaces().Update(c.ctx, ns, metav1.UpdateOptions{}); err != nil {
		c.t.Fatal(err)
	}
	c.api.setNamespace(ns)
}

// addService is a ClusterIP Service whose one endpoint is x/a:80, with its
// EndpointSlice written by hand (no controller runs here).
func (c *twoNodes) addService() {
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "svc"},
		Spec: v1.ServiceSpec{Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}}}}
	svc, err := c.s.Client.CoreV1().Services("x").Create(c.ctx, svc, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	c.svcIP = svc.Spec.ClusterIP
	backend := c.pods["x/a"]
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "svc-1", Labels: map[string]string{
			discoveryv1.LabelServiceName: "svc", discoveryv1.LabelManagedBy: "e2e.netplane.io"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{backend.ip}, NodeName: &backend.node.name,
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](80), Protocol: ptr.To(v1.ProtocolTCP)}},
	}
	if _, err := c.s.Client.DiscoveryV1().EndpointSlices("x").Create(c.ctx, slice, metav1.CreateOptions{}); err != nil {
		c.t.Fatal(err)
	}
}

// setPolicies makes the API's policies exactly nps.
func (c *twoNodes) setPolicies(nps ...*netv1.NetworkPolicy) {
	keep := map[types.NamespacedName]bool{}
	for _, np := range nps {
		c.writePolicy(np)
		keep[types.NamespacedName{Namespace: np.Namespace, Name: np.Name}] = true
	}
	for key := range c.api.policies {
		if !keep[key] {
			c.deletePolicy(key)
		}
	}
}

// writePolicy creates or updates a policy; the oracle reads it only if
// it compiles (one that does not must change nothing).
func (c *twoNodes) writePolicy(np *netv1.NetworkPolicy) {
	api := c.s.Client.NetworkingV1().NetworkPolicies(np.Namespace)
	np = np.DeepCopy()
	old, err := api.Get(c.ctx, np.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = api.Create(c.ctx, np, metav1.CreateOptions{})
	case err == nil:
		np.ResourceVersion = old.ResourceVersion
		_, err = api.Update(c.ctx, np, metav1.UpdateOptions{})
	}
	if err != nil {
		c.t.Fatal(err)
	}
	if _, err := Compile(np); err == nil {
		c.api.setPolicy(c.t, np)
	}
}

func (c *twoNodes) deletePolicy(key types.NamespacedName) {
	err := c.s.Client.NetworkingV1().NetworkPolicies(key.Namespace).Delete(c.ctx, key.Name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		c.t.Fatal(err)
	}
	c.api.deletePolicy(key)
}

// restart stops netplane on n with SIGTERM and starts it again with extra
// flags, once after is done (while it is down).
func (c *twoNodes) restart(n *tnode, after func(), extra ...string) {
	n.proc.Stop(15 * time.Second)
	if err, _ := n.proc.Wait(0); err != nil {
		c.t.Fatalf("netplane on %s did not stop cleanly: %v\n%s", n.name, err, n.proc.Tail(20))
	}
	if after != nil {
		after()
	}
	c.run(n, extra...)
}

// tables lists the nftables tables in n's namespace, as "family name".
func (c *twoNodes) tables(n *tnode) []string {
	out := n.ns.MustExec(c.t, "nft", "list", "tables")
	var tables []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		tables = append(tables, strings.TrimPrefix(line, "table "))
	}
	slices.Sort(tables)
	return tables
}

// denied reads the table's deny counters on n.
func (c *twoNodes) denied(n *tnode) [2]uint64 {
	d, closeNS, err := nft.NamespaceDialer(n.ns.Path)
	if err != nil {
		c.t.Fatal(err)
	}
	defer closeNS()
	got, err := deniedPackets(namespaceCounter{d})()
	if err != nil {
		c.t.Fatal(err)
	}
	return got
}
