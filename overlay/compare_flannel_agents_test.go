package overlay_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
	"github.com/netplane/netplane/nodeview"
	"github.com/netplane/netplane/overlay"
)

// What the Flannel comparisons share: the Node objects both contenders
// read, netplane's node role and flanneld as processes in a node
// namespace, and a watch of a namespace's kernel that times when a node's
// route, neighbour and FDB entry appear.

// flannelPrefix is flanneld's default --kube-annotation-prefix.
const flannelPrefix = "flannel.alpha.coreos.com/"

// flannelNode is the Node object of n. With annotations it carries what
// the node's own flanneld writes once it runs (its VXLAN MAC, which is
// netplane's MAC of the node's address, so that both contenders program
// the same FDB entry); without, only what a kubelet writes, and one
// annotation of it, since flanneld fails on a Node without any.
func flannelNode(n nodeview.Node, annotations bool) *v1.Node {
	ip := n.IPs[0]
	obj := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, Annotations: map[string]string{"node.alpha.kubernetes.io/ttl": "0"}},
		Spec:       v1.NodeSpec{PodCIDR: n.PodCIDRs[0].String(), PodCIDRs: []string{n.PodCIDRs[0].String()}},
		Status:     v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: ip.String()}}},
	}
	if annotations {
		data, _ := json.Marshal(map[string]any{"VNI": 1, "VtepMAC": overlay.MAC(ip).String()})
		for k, v := range map[string]string{"kube-subnet-manager": "true", "backend-type": "vxlan",
			"backend-data": string(data), "public-ip": ip.String()} {
			obj.Annotations[flannelPrefix+k] = v
		}
	}
	return obj
}

// createNode creates the Node; kube-apiserver keeps the status of a Node
// created with one, as a kubelet registers it.
func createNode(tb testing.TB, api *framework.APIServer, obj *v1.Node) {
	tb.Helper()
	if _, err := api.Client.CoreV1().Nodes().Create(framework.Ctx(tb), obj, metav1.CreateOptions{}); err != nil {
		tb.Fatal(err)
	}
}

// agent runs the contenders' processes on one node namespace, one at a
// time, each with a kubeconfig that reaches the test API server through a
// relay in the namespace, and its files and logs in one folder.
type agent struct {
	ns              *netns.NS
	dir, kubeconfig string
	runs            int
	name            string             // of the last process started
	proc            *framework.Process // the last one started
}

func newAgent(tb testing.TB, api *framework.APIServer, ns *netns.NS) *agent {
	tb.Helper()
	a := &agent{ns: ns, dir: tb.TempDir()}
	relay := ns.Forward(tb, "127.0.0.1:0", strings.TrimPrefix(api.URL, "https://"))
	a.kubeconfig = filepath.Join(a.dir, "kubeconfig")
	if err := api.WriteKubeconfig(a.kubeconfig, "https://"+relay, api.Token); err != nil {
		tb.Fatal(err)
	}
	return a
}

func (a *agent) start(tb testing.TB, env []string, bin string, args ...string) {
	tb.Helper()
	a.runs++
	a.name = filepath.Base(bin)
	cmd := a.ns.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	p, err := a.ns.StartCmd(cmd, filepath.Join(a.dir, fmt.Sprintf("%s-%d.log", a.name, a.runs)))
	if err != nil {
		tb.Fatal(err)
	}
	a.proc = p
}

// startNetplane runs the node role as a node runs it (Service proxy, pod
// network, NetworkPolicy, overlay), with its CNI files in the agent's
// folder.
func (a *agent) startNetplane(tb testing.TB, node string, mode overlay.Mode, clusterCIDR string) {
	tb.Helper()
	a.start(tb, nil, filepath.Join(framework.NetplaneBinaries(tb), "netplane"), "--role=node", "--kubeconfig="+a.kubeconfig,
		"--node-name="+node, "--overlay="+string(mode), "--cluster-cidr="+clusterCIDR,
		"--cni-conf-dir="+a.dir, "--cni-bin-dir="+a.dir, "--ipam-state-dir="+filepath.Join(a.dir, "ipam"),
		"--health-bind-address=127.0.0.1:0", "--metrics-bind-address=127.0.0.1:0")
}

// startFlanneld runs flanneld as Flannel's DaemonSet does (--ip-masq
// --kube-subnet-mgr), its net-conf the vxlan backend on netplane's port
// and VNI in nftables mode, without DirectRouting, so every remote node is
// tunnelled.
func (a *agent) startFlanneld(tb testing.TB, bin, node, iface, network string) {
	tb.Helper()
	conf := filepath.Join(a.dir, "net-conf.json")
	data := fmt.Sprintf(`{"Network":%q,"EnableNFTables":true,"Backend":{"Type":"vxlan","Port":4789,"VNI":1}}`, network)
	if err := os.WriteFile(conf, []byte(data), 0o644); err != nil {
		tb.Fatal(err)
	}
	a.start(tb, []string{"NODE_NAME=" + node}, bin, "--ip-masq", "--kube-subnet-mgr", "--kubeconfig-file="+a.kubeconfig,
		"--iface="+iface, "--net-config-path="+conf, "--subnet-file="+a.subnetFile())
}

func (a *agent) subnetFile() string { return filepath.Join(a.dir, "subnet.env") }

// flannelMTU is FLANNEL_MTU of flanneld's subnet file, the MTU Flannel's
// CNI plugin gives pods.
func (a *agent) flannelMTU(tb testing.TB) int {
	tb.Helper()
	data, err := os.ReadFile(a.subnetFile())
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "FLANNEL_MTU="); ok {
			if m, err := strconv.Atoi(v); err == nil {
				return m
			}
		}
	}
	tb.Fatalf("no FLANNEL_MTU in %s:\n%s", a.subnetFile(), data)
	return 0
}

// exited says, when the last process started has ended, which and how.
func (a *agent) exited() string {
	if a.proc == nil || !a.proc.Exited() {
		return ""
	}
	return fmt.Sprintf("%s in %s exited; its log:\n%s", a.name, a.ns.Name, a.proc.Tail(30))
}

// stop ends the last process started. Both contenders leave their kernel
// state in place on exit, by design, so that a restart keeps connections.
func (a *agent) stop() {
	if a.proc != nil {
		a.proc.Stop(5 * time.Second)
	}
}

// clearFlannel removes what flanneld left: its device (and with it its
// routes, neighbours and FDB entries) and its nftables tables.
func clearFlannel(tb testing.TB, ns *netns.NS) {
	tb.Helper()
	if _, err := ns.Exec("ip", "link", "show", "flannel.1"); err == nil {
		ns.MustExec(tb, "ip", "link", "del", "flannel.1")
	}
	for _, t := range []string{"ip flannel-ipv4", "ip6 flannel-ipv6"} {
		if _, err := ns.Exec("nft", "list", "table", t); err == nil {
			ns.MustExec(tb, "nft", "delete", "table", t)
		}
	}
}

// clearNetplane removes what netplane's overlay wrote in ns: its routes,
// and its devices with their entries (flanneld's device takes the same
// VNI and port, which the kernel refuses twice). What the rest of the node
// role wrote stays.
func clearNetplane(tb testing.TB, ns *netns.NS) {
	tb.Helper()
	ns.MustExec(tb, "ip", "route", "flush", "proto", "207")
	for _, dev := range []string{overlay.DeviceV4, overlay.DeviceV6} {
		if _, err := ns.Exec("ip", "link", "show", dev); err == nil {
			ns.MustExec(tb, "ip", "link", "del", dev)
		}
	}
}

// kernelWatch timestamps, as netlink reports them, the routes, neighbours
// and FDB entries that appear in a namespace.
type kernelWatch struct {
	routes chan netlink.RouteUpdate
	neighs chan netlink.NeighUpdate
	done   chan struct{}
}

func watchKernel(tb testing.TB, ns *netns.NS) *kernelWatch {
	tb.Helper()
	h, err := vnetns.GetFromPath(ns.Path)
	if err != nil {
		tb.Fatal(err)
	}
	defer h.Close()
	w := &kernelWatch{routes: make(chan netlink.RouteUpdate, 4096), neighs: make(chan netlink.NeighUpdate, 4096), done: make(chan struct{})}
	big := 8 << 20
	if err := netlink.RouteSubscribeWithOptions(w.routes, w.done, netlink.RouteSubscribeOptions{Namespace: &h, ReceiveBufferSize: big}); err != nil {
		tb.Fatal(err)
	}
	if err := netlink.NeighSubscribeWithOptions(w.neighs, w.done, netlink.NeighSubscribeOptions{Namespace: &h, ReceiveBufferSize: big}); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { close(w.done) })
	return w
}

// appeared waits until every node's entries have been added: the route
// to its pod CIDR, a permanent IPv4 neighbour with its tunnel MAC, and an
// FDB entry of that MAC to its address. It returns when the first and the
// last of them were reported.
func (w *kernelWatch) appeared(nodes []nodeview.Node, timeout time.Duration) (first, last time.Time, err error) {
	pending := map[string]bool{}
	for _, n := range nodes {
		mac := overlay.MAC(n.IPs[0]).String()
		pending["route "+n.PodCIDRs[0].String()] = true
		pending["neighbour "+mac] = true
		pending["fdb "+mac+" "+n.IPs[0].String()] = true
	}
	deadline := time.After(timeout)
	for len(pending) > 0 {
		var key string
		select {
		case u, ok := <-w.routes:
			if !ok {
				return first, last, fmt.Errorf("the route watch ended (netlink buffer overrun?)")
			}
			if u.Type == unix.RTM_NEWROUTE && u.Dst != nil {
				key = "route " + u.Dst.String()
			}
		case u, ok := <-w.neighs:
			if !ok {
				return first, last, fmt.Errorf("the neighbour watch ended (netlink buffer overrun?)")
			}
			switch {
			case u.Type != unix.RTM_NEWNEIGH:
			case u.Family == unix.AF_BRIDGE:
				key = "fdb " + u.HardwareAddr.String() + " " + u.IP.String()
			case u.Family == unix.AF_INET && u.State&netlink.NUD_PERMANENT != 0:
				key = "neighbour " + u.HardwareAddr.String()
			}
		case <-deadline:
			return first, last, fmt.Errorf("after %v, %d entries are missing, among them %s", timeout, len(pending), someKey(pending))
		}
		if pending[key] {
			delete(pending, key)
			last = time.Now()
			if first.IsZero() {
				first = last
			}
		}
	}
	return first, last, nil
}

func someKey(m map[string]bool) string {
	for k := range m {
		return k
	}
	return ""
}
