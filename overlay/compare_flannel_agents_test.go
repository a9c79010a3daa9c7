package overlay_test

import (
	"context"
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
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
	"github.com/netplane/netplane/internal/runner"
	"github.com/netplane/netplane/overlay"
)

// What the Flannel comparisons share: the Node objects both contenders
// read, flanneld as a process in a node namespace, netplane's overlay
// driven by a Node informer, and a watch of a namespace's kernel that
// times when a node's route, neighbour and FDB entry appear.

// flannelPrefix is flanneld's default --kube-annotation-prefix.
const flannelPrefix = "flannel.alpha.coreos.com/"

// flannelNode is the Node object of n. With annotations it carries what
// the node's own flanneld writes once it runs (its VXLAN MAC, which is
// netplane's MAC of the node's address, so that both contenders program
// the same FDB entry); without, only what a kubelet writes, and one
// annotation of it, since flanneld fails on a Node without any.
func flannelNode(n overlay.Node, annotations bool) *v1.Node {
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

// flanneld is how the comparisons run Flannel on one node namespace: its
// net-conf (the vxlan backend on netplane's port and VNI, nftables mode,
// no DirectRouting, so every remote node is tunnelled), a kubeconfig that
// reaches the test API server through a relay in the namespace, and the
// files it writes.
type flanneld struct {
	bin, node, iface, dir, kubeconfig string
	ns                                *netns.NS
	runs                              int
	proc                              *framework.Process // the running one
}

func newFlanneld(tb testing.TB, bin string, api *framework.APIServer, ns *netns.NS, node, iface, network string) *flanneld {
	tb.Helper()
	f := &flanneld{bin: bin, node: node, iface: iface, dir: tb.TempDir(), ns: ns}
	conf := fmt.Sprintf(`{"Network":%q,"EnableNFTables":true,"Backend":{"Type":"vxlan","Port":4789,"VNI":1}}`, network)
	if err := os.WriteFile(filepath.Join(f.dir, "net-conf.json"), []byte(conf), 0o644); err != nil {
		tb.Fatal(err)
	}
	relay := ns.Forward(tb, "127.0.0.1:0", strings.TrimPrefix(api.URL, "https://"))
	f.kubeconfig = filepath.Join(f.dir, "kubeconfig")
	if err := api.WriteKubeconfig(f.kubeconfig, "https://"+relay, api.Token); err != nil {
		tb.Fatal(err)
	}
	return f
}

// start runs flanneld as the Flannel DaemonSet does, less --ip-masq (its
// default is off): masquerading adds a NAT hook and so connection tracking
// to every packet, which netplane's overlay here runs without.
func (f *flanneld) start(tb testing.TB) {
	tb.Helper()
	f.runs++
	cmd := f.ns.Command(f.bin, "--kube-subnet-mgr", "--kubeconfig-file="+f.kubeconfig, "--iface="+f.iface,
		"--net-config-path="+filepath.Join(f.dir, "net-conf.json"), "--subnet-file="+f.subnetFile())
	cmd.Env = append(os.Environ(), "NODE_NAME="+f.node)
	p, err := f.ns.StartCmd(cmd, filepath.Join(f.dir, fmt.Sprintf("flanneld-%d.log", f.runs)))
	if err != nil {
		tb.Fatal(err)
	}
	f.proc = p
}

// tail is the end of the log of the last flanneld started, or what says
// none was.
func (f *flanneld) tail() string {
	if f.proc == nil {
		return "(not started)"
	}
	return f.proc.Tail(30)
}

func (f *flanneld) subnetFile() string { return filepath.Join(f.dir, "subnet.env") }

// mtu is FLANNEL_MTU of the subnet file, the MTU Flannel's CNI plugin
// gives pods.
func (f *flanneld) mtu(tb testing.TB) int {
	tb.Helper()
	data, err := os.ReadFile(f.subnetFile())
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
	tb.Fatalf("no FLANNEL_MTU in %s:\n%s", f.subnetFile(), data)
	return 0
}

// stop ends flanneld and removes what it left in the kernel: it deletes
// nothing on exit, by design, so that a restart keeps connections.
func (f *flanneld) stop(tb testing.TB) {
	tb.Helper()
	f.proc.Stop(5 * time.Second)
	if _, err := f.ns.Exec("ip", "link", "show", "flannel.1"); err == nil {
		f.ns.MustExec(tb, "ip", "link", "del", "flannel.1")
	}
	// Its tables, and those the iptables binary makes when flanneld cleans
	// up the iptables rules it does not use.
	f.ns.MustExec(tb, "nft", "flush", "ruleset")
}

// clearNetplane removes what netplane's overlay wrote in ns: its routes,
// and its devices with their entries (flanneld's device takes the same
// VNI and port, which the kernel refuses twice).
func clearNetplane(tb testing.TB, ns *netns.NS) {
	tb.Helper()
	ns.MustExec(tb, "ip", "route", "flush", "proto", "207")
	for _, dev := range []string{overlay.DeviceV4, overlay.DeviceV6} {
		if _, err := ns.Exec("ip", "link", "show", dev); err == nil {
			ns.MustExec(tb, "ip", "link", "del", dev)
		}
	}
}

// netplaneAgent runs netplane's overlay in ns as the node role wires it:
// a Node informer whose every change requests a sync, a runner with the
// node role's default --min-sync-period (100ms) and --sync-period (30s),
// and each sync the Syncer's over the informer's Nodes. It stops with the
// returned function.
func netplaneAgent(tb testing.TB, api *framework.APIServer, h *netlink.Handle, self string, cfg overlay.Config) (stop func()) {
	tb.Helper()
	s, err := overlay.NewSyncer(h, cfg, nil)
	if err != nil {
		tb.Fatal(err)
	}
	factory := informers.NewSharedInformerFactory(api.Client, 0)
	inf := factory.Core().V1().Nodes()
	r := runner.New(func(context.Context, bool) error {
		objs, err := inf.Lister().List(labels.Everything())
		if err != nil {
			return err
		}
		var nodes []overlay.Node
		for _, o := range objs {
			nodes = append(nodes, overlay.NodeOf(o))
		}
		if _, err = s.Sync(self, nodes); err != nil {
			tb.Logf("netplane sync failed, retried after a second as the node role does: %v", err)
		}
		return err
	}, runner.Options{MinInterval: 100 * time.Millisecond, FullInterval: 30 * time.Second})
	changed := func(any) { r.Request() }
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: changed, DeleteFunc: changed,
		UpdateFunc: func(_, o any) { changed(o) }}); err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	return func() { cancel(); <-done; factory.Shutdown() }
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
func (w *kernelWatch) appeared(nodes []overlay.Node, timeout time.Duration) (first, last time.Time, err error) {
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
