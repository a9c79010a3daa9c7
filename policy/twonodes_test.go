package policy

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	netv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
	"github.com/netplane/netplane/e2e/testcluster"
	"github.com/netplane/netplane/nft"
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
	*testcluster.Cluster
	// t is the running test or subtest, which helpers fail; root is the
	// suite's, which owns what outlives a subtest (processes, logs).
	t, root *testing.T
	ext     *netns.NS
	pods    map[string]*tpod // by "ns/name"
	api     *cluster         // the API objects as the oracle reads them
	sctp    *sctpSeen
	svcIP   string // a ClusterIP whose one backend is x/a:80
	// disabled are the nodes running with --network-policy=false.
	disabled map[string]bool
	last     map[tprobe]bool // what the previous check expected
}

type tnode = testcluster.Node

type tpod struct {
	*testcluster.Pod
	key string
	obj *v1.Pod
}

// newTwoNodes brings the cluster up: API server, underlay, the outside
// host, both nodes at 192.168.77.1<i> and fd00:77::1<i> with pod CIDRs
// 10.244.<i>.0/24 and fd00:10:244:<i>::/64, the pods, and a Service for
// x/a.
func newTwoNodes(t *testing.T) *twoNodes {
	c := &twoNodes{t: t, root: t, pods: map[string]*tpod{}, api: newCluster(nil, nil),
		disabled: map[string]bool{}, sctp: newSCTPSeen()}
	c.Cluster = testcluster.New(t, testcluster.Options{
		// Without strict CIDR validation the API server takes "010.0.0.0/8",
		// as it kept objects stored before: a policy that does not compile.
		APIServer: framework.Options{ExtraArgs: []string{"--feature-gates=StrictIPCIDRValidation=false"}},
		Subnets:   []testcluster.Subnet{{V4: "192.168.77.", V6: "fd00:77::", Gateway: extIP}},
		IPv6:      true, Timeout: 30 * time.Minute, NoStart: true,
	})
	c.ext, _, _ = c.AddHost(t, "ext", 0, "100", "100")
	for _, n := range c.Nodes {
		c.run(n)
		c.ext.Route(t, fmt.Sprintf("10.244.%d.0/24", n.Index), "via", n.IP)
		c.ext.Route(t, fmt.Sprintf("fd00:10:244:%d::/64", n.Index), "via", n.IP6)
	}
	serve(t, c.ext, ":80")
	serve(t, c.ext, ":81")
	for _, n := range c.Nodes {
		c.WaitForCNI(t, n)
	}
	for _, ns := range modelNamespaces {
		obj := modelNamespace(ns)
		if _, err := c.API.Client.CoreV1().Namespaces().Create(c.Ctx, obj, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		c.api.setNamespace(obj)
	}
	for _, p := range e2ePods {
		c.addPod(p.key, c.Nodes[p.node-1])
	}
	c.addService()
	return c
}

// run starts netplane on n with the suite's flags and extra.
func (c *twoNodes) run(n *tnode, extra ...string) {
	c.Start(c.t, n, append([]string{"--service-cidrs=10.96.0.0/16,fd00:10:96::/112",
		"--sync-period=" + syncPeriod.String(), "--network-policy-log-denied", "--v=2"}, extra...)...)
}

// addPod makes pod key ("ns/name") on n: its namespace through the CNI
// plugin the node installed, as a runtime would, its servers, and its API
// object with the addresses the plugin gave.
func (c *twoNodes) addPod(key string, n *tnode) *tpod {
	t := c.t
	p := &tpod{Pod: c.AddPod(t, n, strings.ReplaceAll(key, "/", "-")), key: key}
	for _, port := range []string{":80", ":81"} {
		serve(t, p.NS, port)
	}
	c.sctp.listen(t, p.NS)
	ns, name, _ := strings.Cut(key, "/")
	obj := modelPod(ns, name)
	if key == "z/c" { // a pod whose named ports are not its neighbours'
		obj.Spec.Containers[0].Ports[0].Name, obj.Spec.Containers[3].Ports[0].Name = "serve-81-tcp", "serve-80-tcp"
	}
	for i := range obj.Spec.Containers {
		obj.Spec.Containers[i].Image = "registry.invalid/none"
	}
	obj.Spec.NodeName = n.Name
	obj.Status = testcluster.Running(p.IP, p.IP6)
	p.obj = c.writePod(obj)
	c.pods[key] = p
	return p
}

// writePod creates or updates a pod and its status, and tells the oracle.
func (c *twoNodes) writePod(obj *v1.Pod) *v1.Pod {
	got := c.WritePod(c.t, obj)
	c.api.setPod(got)
	return got
}

func (c *twoNodes) deletePod(key string) {
	p := c.pods[key]
	if err := c.API.Client.CoreV1().Pods(p.obj.Namespace).Delete(c.Ctx, p.obj.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		c.t.Fatal(err)
	}
	c.api.deletePod(types.NamespacedName{Namespace: p.obj.Namespace, Name: p.obj.Name})
	delete(c.pods, key)
}

func (c *twoNodes) setNamespaceLabels(name string, labels map[string]string) {
	ns, err := c.API.Client.CoreV1().Namespaces().Get(c.Ctx, name, metav1.GetOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	ns.Labels = labels
	if ns, err = c.API.Client.CoreV1().Namespaces().Update(c.Ctx, ns, metav1.UpdateOptions{}); err != nil {
		c.t.Fatal(err)
	}
	c.api.setNamespace(ns)
}

// addService is a ClusterIP Service whose one endpoint is x/a:80.
func (c *twoNodes) addService() {
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "svc"},
		Spec: v1.ServiceSpec{Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}}}}
	svc = c.AddService(c.t, svc, discoveryv1.EndpointPort{Name: ptr.To("http"), Port: ptr.To[int32](80), Protocol: ptr.To(v1.ProtocolTCP)},
		testcluster.Endpoint(c.pods["x/a"].Pod, testcluster.Ready))
	c.svcIP = svc.Spec.ClusterIP
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
	api := c.API.Client.NetworkingV1().NetworkPolicies(np.Namespace)
	np = np.DeepCopy()
	old, err := api.Get(c.Ctx, np.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = api.Create(c.Ctx, np, metav1.CreateOptions{})
	case err == nil:
		np.ResourceVersion = old.ResourceVersion
		_, err = api.Update(c.Ctx, np, metav1.UpdateOptions{})
	}
	if err != nil {
		c.t.Fatal(err)
	}
	if _, err := Compile(np); err == nil {
		c.api.setPolicy(c.t, np)
	}
}

func (c *twoNodes) deletePolicy(key types.NamespacedName) {
	err := c.API.Client.NetworkingV1().NetworkPolicies(key.Namespace).Delete(c.Ctx, key.Name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		c.t.Fatal(err)
	}
	c.api.deletePolicy(key)
}

// restart stops netplane on n with SIGTERM and starts it again with extra
// flags, once after is done (while it is down).
func (c *twoNodes) restart(n *tnode, after func(), extra ...string) {
	c.Stop(n)
	if err, _ := n.Proc.Wait(0); err != nil {
		c.t.Fatalf("netplane on %s did not stop cleanly: %v\n%s", n.Name, err, n.Proc.Tail(20))
	}
	if after != nil {
		after()
	}
	c.run(n, extra...)
}

// tables lists the nftables tables in n's namespace, as "family name".
func (c *twoNodes) tables(n *tnode) []string {
	out := n.NS.MustExec(c.t, "nft", "list", "tables")
	var tables []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		tables = append(tables, strings.TrimPrefix(line, "table "))
	}
	slices.Sort(tables)
	return tables
}

// denied reads the table's deny counters on n.
func (c *twoNodes) denied(n *tnode) [2]uint64 {
	d, closeNS, err := nft.NamespaceDialer(n.NS.Path)
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
