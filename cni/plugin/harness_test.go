package plugin_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/vishvananda/netlink"
	vns "github.com/vishvananda/netns"

	"github.com/netplane/netplane/cni/ipam"
	"github.com/netplane/netplane/cni/plugin"
	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
)

// pluginDir holds the netplane-cni the tests run
// (framework.NetplaneBinaries), so they exercise the current code through
// its real binary.
func pluginDir(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skip("runs the plugin binary; skipped with -short")
	}
	return framework.NetplaneBinaries(t)
}

func TestMain(m *testing.M) { framework.Main(m) }

// node is a throwaway namespace playing the node, with the plugin's
// configuration and state in a temporary directory.
type node struct {
	ns       *netns.NS
	stateDir string
	cni      *libcni.CNIConfig
	list     *libcni.NetworkConfigList
	podCIDRs []string
}

type nodeOpts struct {
	version  string // cniVersion; "" is the conflist netplane writes
	podCIDRs []string
	extra    map[string]any // more plugin fields
}

func newNode(t *testing.T, o nodeOpts) *node {
	t.Helper()
	framework.RequireRoot(t)
	if o.podCIDRs == nil {
		o.podCIDRs = []string{"10.244.1.0/24"}
	}
	n := &node{ns: netns.New(t, "node"), stateDir: t.TempDir(), podCIDRs: o.podCIDRs}
	n.cni = newCNI([]string{pluginDir(t)}, t.TempDir())
	n.list = n.conflist(t, o)
	return n
}

func (n *node) conflist(t *testing.T, o nodeOpts) *libcni.NetworkConfigList {
	t.Helper()
	p := map[string]any{
		"type": "netplane-cni", "bridge": "cni0", "mtu": 1400,
		"podCIDRs": o.podCIDRs, "stateDir": n.stateDir,
		"capabilities": map[string]bool{"portMappings": true},
	}
	for k, v := range o.extra {
		p[k] = v
	}
	l := map[string]any{"name": "netplane", "plugins": []any{p}}
	if o.version == "" {
		l["cniVersion"], l["cniVersions"] = "1.0.0", []string{"1.0.0", "1.1.0"}
	} else {
		l["cniVersion"] = o.version
	}
	b, _ := json.Marshal(l)
	list, err := libcni.NetworkConfFromBytes(b)
	if err != nil {
		t.Fatal(err)
	}
	return list
}

func rt(pod *netns.NS, cid string) *libcni.RuntimeConf {
	path := ""
	if pod != nil {
		path = pod.Path
	}
	return &libcni.RuntimeConf{ContainerID: cid, NetNS: path, IfName: "eth0"}
}

// do runs a libcni call on a thread inside the node namespace, so the plugin
// process it execs lives in the node namespace too.
func (n *node) do(fn func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return n.ns.Do(func() error { return fn(ctx) })
}

func (n *node) add(r *libcni.RuntimeConf) (types.Result, error) {
	var res types.Result
	err := n.do(func(ctx context.Context) error {
		var err error
		res, err = n.cni.AddNetworkList(ctx, n.list, r)
		return err
	})
	return res, err
}

func (n *node) mustAdd(t *testing.T, r *libcni.RuntimeConf) *current.Result {
	t.Helper()
	res, err := n.add(r)
	if err != nil {
		t.Fatalf("ADD %s: %v", r.ContainerID, err)
	}
	c, err := current.NewResultFromResult(res)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (n *node) del(r *libcni.RuntimeConf) error {
	return n.do(func(ctx context.Context) error { return n.cni.DelNetworkList(ctx, n.list, r) })
}

func (n *node) mustDel(t *testing.T, r *libcni.RuntimeConf) {
	t.Helper()
	if err := n.del(r); err != nil {
		t.Fatalf("DEL %s: %v", r.ContainerID, err)
	}
}

func (n *node) check(r *libcni.RuntimeConf) error {
	return n.do(func(ctx context.Context) error { return n.cni.CheckNetworkList(ctx, n.list, r) })
}

func (n *node) state(t *testing.T) *ipam.State {
	t.Helper()
	st, err := (&ipam.Store{Dir: n.stateDir, BootID: bootID(t)}).Read()
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func bootID(t *testing.T) string {
	b, err := os.ReadFile(ipam.BootIDPath)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// handle is a netlink handle bound to a namespace, closed at test end.
func handle(t testing.TB, ns *netns.NS) *netlink.Handle {
	t.Helper()
	h, err := vns.GetFromPath(ns.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	nl, err := netlink.NewHandleAt(h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nl.Close)
	return nl
}

// veths lists our host veths (npv…) in the node.
func (n *node) veths(t *testing.T) []string {
	t.Helper()
	links, err := handle(t, n.ns).LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, "npv") {
			out = append(out, l.Attrs().Name)
		}
	}
	return out
}

// bridgePorts lists the interfaces enslaved to cni0 in the node.
func (n *node) bridgePorts(t *testing.T) []string {
	t.Helper()
	h := handle(t, n.ns)
	br, err := h.LinkByName("cni0")
	if err != nil {
		t.Fatal(err)
	}
	links, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range links {
		if l.Attrs().MasterIndex == br.Attrs().Index {
			out = append(out, l.Attrs().Name)
		}
	}
	return out
}

// requireClean fails unless the node has no attachment, host veth or
// hostPort table left.
func (n *node) requireClean(t *testing.T) {
	t.Helper()
	if st := n.state(t); len(st.Attachments) != 0 {
		t.Errorf("IPAM records left: %+v", st.Attachments)
	}
	if v := n.veths(t); len(v) != 0 {
		t.Errorf("host veths left: %v", v)
	}
	if n.hostPortTable(t) {
		t.Errorf("hostPort table %s left", plugin.HostPortTable)
	}
}

func addrOf(t *testing.T, res *current.Result, v6 bool) netip.Addr {
	t.Helper()
	for _, ip := range res.IPs {
		a, _ := netip.AddrFromSlice(ip.Address.IP)
		a = a.Unmap()
		if a.Is6() == v6 {
			return a
		}
	}
	t.Fatalf("no %v address in %+v", map[bool]string{true: "IPv6", false: "IPv4"}[v6], res.IPs)
	return netip.Addr{}
}

func cniCode(err error) uint {
	var e *types.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return 0
}

// hostPortTable reports whether the node has the plugin's hostPort table.
func (n *node) hostPortTable(t *testing.T) bool {
	t.Helper()
	out, err := n.ns.Exec("nft", "list", "table", "inet", plugin.HostPortTable.Name)
	if err != nil && !strings.Contains(out, "No such file") {
		t.Fatalf("nft list table: %v\n%s", err, out)
	}
	return err == nil
}

// newCNI is a libcni client safe for concurrent calls: libcni creates its
// default exec lazily, unsynchronised, on the first call.
func newCNI(path []string, cacheDir string) *libcni.CNIConfig {
	exec := &invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: os.Stderr}, PluginDecoder: version.PluginDecoder{}}
	return libcni.NewCNIConfigWithCacheDir(path, cacheDir, exec)
}
