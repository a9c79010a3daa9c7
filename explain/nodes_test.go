package explain

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
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
	"k8s.io/utils/ptr"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
	"github.com/netplane/netplane/podnet"
)

// The real thing: a kube-apiserver, two nodes in network namespaces on
// one underlay subnet each running `netplane --role=node`, pods made
// through the CNI plugin the nodes install, serving echo on 80 and 8080.
// `netplane explain` runs inside a node's namespace, as in the node
// agent's pod, and its verdict is compared with a real connection.

func TestMain(m *testing.M) {
	if os.Geteuid() == 0 {
		netns.RemoveStale()
	}
	framework.Main(m)
}

type cluster struct {
	t     *testing.T
	s     *framework.APIServer
	ctx   context.Context
	sw    *netns.NS
	nodes []*tnode
	pods  map[string]*tpod
	bin   string
}

type tnode struct {
	name, ip   string
	ns         *netns.NS
	dir        string
	proc       *framework.Process
	kubeconfig string
}

type tpod struct {
	node *tnode
	ns   *netns.NS
	ip   string
}

func newCluster(t *testing.T) *cluster {
	framework.RequireRoot(t)
	_, err := os.Stat("/proc/sys/net/bridge")
	framework.Require(t, err == nil, "br_netfilter is not loaded (modprobe br_netfilter)")
	s := framework.StartAPIServer(t, framework.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	t.Cleanup(cancel)
	c := &cluster{t: t, s: s, ctx: ctx, pods: map[string]*tpod{}, bin: filepath.Join(framework.NetplaneBinaries(t), "netplane")}
	c.sw = netns.New(t, "underlay")
	c.sw.Bridge(t, "br0")
	for i := 1; i <= 2; i++ {
		c.nodes = append(c.nodes, c.startNode(i))
	}
	for _, n := range c.nodes {
		framework.Eventually(t, 60*time.Second, "the CNI plugin on "+n.name, func() error {
			if n.proc.Exited() {
				t.Fatalf("netplane on %s exited:\n%s", n.name, n.proc.Tail(30))
			}
			_, err := os.Stat(filepath.Join(n.dir, "net.d", podnet.ConflistName))
			return err
		})
	}
	for _, ns := range []string{"x", "y"} {
		obj := &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"ns": ns}}}
		if _, err := s.Client.CoreV1().Namespaces().Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

func (c *cluster) startNode(i int) *tnode {
	t := c.t
	n := &tnode{name: fmt.Sprintf("node%d", i), ip: fmt.Sprintf("192.168.79.1%d", i), dir: t.TempDir()}
	n.ns = netns.Host(t, n.name, c.sw, "u-"+n.name, "eth0")
	c.sw.Attach(t, "u-"+n.name, "br0")
	n.ns.Addr(t, "eth0", n.ip+"/24")
	n.ns.Route(t, "default", "via", "192.168.79.254") // a router that is never asked: what is not dropped before goes there
	cidr := fmt.Sprintf("10.244.%d.0/24", i)
	obj := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name}, Spec: v1.NodeSpec{PodCIDR: cidr, PodCIDRs: []string{cidr}}}
	created, err := c.s.Client.CoreV1().Nodes().Create(c.ctx, obj, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	created.Status.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: n.ip}}
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

// run starts the node agent. Its full sync, which would repair a kernel
// changed by hand, comes only every 10 minutes.
func (c *cluster) run(n *tnode) {
	n.proc = n.ns.Start(c.t, c.bin, "--role=node", "--kubeconfig="+n.kubeconfig, "--node-name="+n.name,
		"--cni-conf-dir="+filepath.Join(n.dir, "net.d"), "--cni-bin-dir="+filepath.Join(n.dir, "bin"),
		"--ipam-state-dir="+filepath.Join(n.dir, "ipam"), "--cluster-cidr=10.244.0.0/16", "--service-cidrs=10.96.0.0/16",
		"--sync-period=10m", "--health-bind-address=127.0.0.1:0", "--metrics-bind-address=127.0.0.1:0", "--v=1")
}

// addPod makes pod key on n through the node's CNI plugin, serving echo on
// 80 and 8080 (named http), and its API object.
func (c *cluster) addPod(key string, n *tnode, labels map[string]string) {
	t := c.t
	p := &tpod{node: n, ns: netns.New(t, "pod")}
	list, err := libcni.ConfListFromFile(filepath.Join(n.dir, "net.d", podnet.ConflistName))
	if err != nil {
		t.Fatal(err)
	}
	cni := libcni.NewCNIConfigWithCacheDir([]string{filepath.Join(n.dir, "bin")}, filepath.Join(n.dir, "cache"), nil)
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
	if err != nil || len(res.IPs) == 0 {
		t.Fatalf("ADD %s on %s: %v (%v)", key, n.name, err, res)
	}
	t.Cleanup(func() {
		_ = n.ns.Do(func() error { return cni.DelNetworkList(context.Background(), list, rt) })
	})
	p.ip = res.IPs[0].Address.IP.String()
	p.ns.ServeEcho(t, ":80", key)
	p.ns.ServeEcho(t, ":8080", key)
	ns, name, _ := strings.Cut(key, "/")
	obj := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: v1.PodSpec{NodeName: n.name, Containers: []v1.Container{{Name: "c", Image: "registry.invalid/none",
			Ports: []v1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: v1.ProtocolTCP}}}}}}
	obj, err = c.s.Client.CoreV1().Pods(ns).Create(c.ctx, obj, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	obj.Status = v1.PodStatus{Phase: v1.PodRunning, PodIP: p.ip, PodIPs: []v1.PodIP{{IP: p.ip}}}
	if _, err := c.s.Client.CoreV1().Pods(ns).UpdateStatus(c.ctx, obj, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.pods[key] = p
}

// addService is Service ns/name, port 80 → 8080 of the given pods, with its
// EndpointSlice written by hand (no controller runs here).
func (c *cluster) addService(ns, name string, mod func(*v1.Service), backends ...string) *v1.Service {
	return c.addServiceWith(ns, name, mod, discoveryv1.EndpointConditions{Ready: ptr.To(true)}, backends...)
}

// addServiceWith is addService with the endpoints' conditions.
func (c *cluster) addServiceWith(ns, name string, mod func(*v1.Service), cond discoveryv1.EndpointConditions, backends ...string) *v1.Service {
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1.ServiceSpec{Ports: []v1.ServicePort{{Port: 80, Protocol: v1.ProtocolTCP}}}}
	if mod != nil {
		mod(svc)
	}
	svc, err := c.s.Client.CoreV1().Services(ns).Create(c.ctx, svc, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-1", Labels: map[string]string{
			discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "e2e.netplane.io"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To(""), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.ProtocolTCP)}},
	}
	for _, b := range backends {
		p := c.pods[b]
		bns, bname, _ := strings.Cut(b, "/")
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{p.ip}, NodeName: &p.node.name,
			Conditions: cond,
			TargetRef:  &v1.ObjectReference{Kind: "Pod", Namespace: bns, Name: bname}})
	}
	if _, err := c.s.Client.DiscoveryV1().EndpointSlices(ns).Create(c.ctx, sl, metav1.CreateOptions{}); err != nil {
		c.t.Fatal(err)
	}
	return svc
}

// setPolicies makes the API's policies of namespaces x and y exactly nps.
func (c *cluster) setPolicies(nps ...*netv1.NetworkPolicy) {
	for _, ns := range []string{"x", "y"} {
		err := c.s.Client.NetworkingV1().NetworkPolicies(ns).DeleteCollection(c.ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			c.t.Fatal(err)
		}
	}
	for _, np := range nps {
		if _, err := c.s.Client.NetworkingV1().NetworkPolicies(np.Namespace).Create(c.ctx, np.DeepCopy(), metav1.CreateOptions{}); err != nil {
			c.t.Fatal(err)
		}
	}
}

// explain runs `netplane explain -o json` in n's namespace.
func (c *cluster) explain(n *tnode, args ...string) (*Explanation, string, error) {
	cmd := n.ns.Command(c.bin, append([]string{"explain", "--kubeconfig=" + n.kubeconfig, "-o", "json"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	raw, err := cmd.Output()
	out := string(raw)
	if err != nil {
		return nil, out + stderr.String(), err
	}
	var x Explanation
	if err := json.Unmarshal([]byte(out), &x); err != nil {
		return nil, out, fmt.Errorf("%v: %s", err, out)
	}
	return &x, out, nil
}

// connects is whether a real TCP connection from pod src to addr gets an
// answer.
func (c *cluster) connects(src, addr string) bool {
	_, err := c.pods[src].ns.Ask("tcp", addr, 700*time.Millisecond)
	return err == nil
}
