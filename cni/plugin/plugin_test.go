package plugin_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"

	"github.com/netplane/netplane/cni/ipam"
	"github.com/netplane/netplane/cni/plugin"
	"github.com/netplane/netplane/e2e/netns"
)

func TestAddInEachSpecVersionAnswersInThatVersionAndSetsUpTheKernel(t *testing.T) {
	for _, v := range []string{"0.4.0", "1.0.0", "1.1.0"} {
		t.Run(v, func(t *testing.T) {
			n := newNode(t, nodeOpts{version: v})
			pod := netns.New(t, "pod")
			r := rt(pod, "c-"+strings.ReplaceAll(v, ".", ""))
			raw, err := n.add(r)
			if err != nil {
				t.Fatal(err)
			}
			if raw.Version() != v {
				t.Fatalf("result version %s, want %s", raw.Version(), v)
			}
			res, _ := current.NewResultFromResult(raw)
			if len(res.Interfaces) != 3 || res.Interfaces[2].Name != "eth0" || res.Interfaces[2].Sandbox != pod.Path ||
				res.Interfaces[0].Name != "cni0" || res.Interfaces[1].Name != plugin.VethName(r.ContainerID, "eth0") {
				t.Fatalf("interfaces: %+v", res.Interfaces)
			}
			if len(res.IPs) != 1 || res.IPs[0].Interface == nil || *res.IPs[0].Interface != 2 || res.IPs[0].Address.String() != "10.244.1.2/24" {
				t.Fatalf("ips: %+v", res.IPs)
			}
			requirePodKernelState(t, n, pod, r.ContainerID, "10.244.1.2/24", "10.244.1.1")
			if err := n.check(r); err != nil {
				t.Fatalf("CHECK right after ADD: %v", err)
			}
			n.mustDel(t, r)
			n.requireClean(t)
		})
	}
}

func requirePodKernelState(t *testing.T, n *node, pod *netns.NS, cid, cidr, gw string) {
	t.Helper()
	p := handle(t, pod)
	eth0, err := p.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	if eth0.Attrs().MTU != 1400 || eth0.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("pod eth0: mtu %d flags %v, want 1400 and up", eth0.Attrs().MTU, eth0.Attrs().Flags)
	}
	addrs, _ := p.AddrList(eth0, netlink.FAMILY_V4)
	if len(addrs) != 1 || addrs[0].IPNet.String() != cidr {
		t.Errorf("pod addresses %v, want %s", addrs, cidr)
	}
	routes, _ := p.RouteList(eth0, netlink.FAMILY_V4)
	if !slices.ContainsFunc(routes, func(r netlink.Route) bool {
		return r.Gw.String() == gw && (r.Dst == nil || r.Dst.String() == "0.0.0.0/0")
	}) {
		t.Errorf("pod routes %v lack default via %s", routes, gw)
	}
	h := handle(t, n.ns)
	br, err := h.LinkByName("cni0")
	if err != nil {
		t.Fatal(err)
	}
	braddrs, _ := h.AddrList(br, netlink.FAMILY_V4)
	if !slices.ContainsFunc(braddrs, func(a netlink.Addr) bool { return a.IP.String() == gw }) {
		t.Errorf("bridge addresses %v lack gateway %s", braddrs, gw)
	}
	veth, err := h.LinkByName(plugin.VethName(cid, "eth0"))
	if err != nil {
		t.Fatal(err)
	}
	if veth.Attrs().MasterIndex != br.Attrs().Index || veth.Attrs().MTU != 1400 || veth.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("host veth: master %d (bridge %d), mtu %d, flags %v", veth.Attrs().MasterIndex, br.Attrs().Index, veth.Attrs().MTU, veth.Attrs().Flags)
	}
	if out := n.ns.MustExec(t, "ip", "-d", "link", "show", veth.Attrs().Name); !strings.Contains(out, "hairpin on") {
		t.Errorf("host veth without hairpin:\n%s", out)
	}
}

func TestAddTwiceFailsAndReservesNothingMore(t *testing.T) {
	n := newNode(t, nodeOpts{})
	pod := netns.New(t, "pod")
	r := rt(pod, "twice")
	n.mustAdd(t, r)
	if _, err := n.add(r); err == nil || !strings.Contains(err.Error(), "already has interface eth0") {
		t.Fatalf("second ADD: %v, want an error saying the attachment exists", err)
	}
	if st := n.state(t); len(st.Attachments) != 1 {
		t.Fatalf("%d records after a repeated ADD, want 1", len(st.Attachments))
	}
	// The same container with a second interface gets a second address.
	r2 := rt(pod, "twice")
	r2.IfName = "net1"
	res := n.mustAdd(t, r2)
	if res.IPs[0].Address.String() != "10.244.1.3/24" {
		t.Fatalf("second interface got %v", res.IPs[0].Address)
	}
}

func TestDelIsBestEffortAndIdempotent(t *testing.T) {
	n := newNode(t, nodeOpts{})
	t.Run("without ADD", func(t *testing.T) { n.mustDel(t, rt(netns.New(t, "pod"), "never-added")) })
	t.Run("twice", func(t *testing.T) {
		r := rt(netns.New(t, "pod"), "twice")
		n.mustAdd(t, r)
		n.mustDel(t, r)
		n.mustDel(t, r)
	})
	t.Run("empty netns releases the address and the veth", func(t *testing.T) {
		r := rt(netns.New(t, "pod"), "empty-netns")
		n.mustAdd(t, r)
		r.NetNS = ""
		n.mustDel(t, r)
	})
	t.Run("after the netns was deleted", func(t *testing.T) {
		pod := netns.New(t, "pod")
		r := rt(pod, "gone")
		r.CapabilityArgs = map[string]any{"portMappings": []map[string]any{{"hostPort": 30999, "containerPort": 80, "protocol": "tcp"}}}
		n.mustAdd(t, r)
		if err := pod.Delete(); err != nil {
			t.Fatal(err)
		}
		n.mustDel(t, r)
	})
	t.Run("with a config whose pod CIDRs became invalid", func(t *testing.T) {
		r := rt(netns.New(t, "pod"), "bad-conf")
		n.mustAdd(t, r)
		broken := n.conflist(t, nodeOpts{podCIDRs: []string{"garbage"}})
		if err := n.do(func(ctx context.Context) error { return n.cni.DelNetworkList(ctx, broken, r) }); err != nil {
			t.Fatalf("DEL: %v", err)
		}
	})
	n.requireClean(t)
}

// TestDelInALivingNetnsRemovesThePairAndAddWorksAgain: a runtime may keep
// the netns after DEL, or ADD into it again. Nothing of the old attachment
// may stay there: its address is free for IPAM to give to another pod.
func TestDelInALivingNetnsRemovesThePairAndAddWorksAgain(t *testing.T) {
	n := newNode(t, nodeOpts{podCIDRs: []string{"10.244.1.0/24", "fd00:10:244:1::/64"}})
	pod := netns.New(t, "pod")
	r := rt(pod, "living")
	n.mustAdd(t, r)
	n.mustDel(t, r)
	if _, err := handle(t, pod).LinkByName("eth0"); err == nil {
		t.Fatalf("pod eth0 still there after DEL:\n%s", pod.MustExec(t, "ip", "addr", "show"))
	}
	if v := n.veths(t); len(v) != 0 {
		t.Fatalf("host veths after DEL: %v", v)
	}
	if ports := n.bridgePorts(t); len(ports) != 0 {
		t.Fatalf("bridge ports after DEL: %v", ports)
	}
	// ADD again in the same netns: the same attachment, as a runtime
	// re-running ADD does, and another container's.
	for _, cid := range []string{"living", "living-next"} {
		again := rt(pod, cid)
		res := n.mustAdd(t, again)
		if err := n.check(again); err != nil {
			t.Fatalf("CHECK after ADD into the netns of a deleted attachment: %v", err)
		}
		if out := pod.MustExec(t, "ip", "-o", "addr", "show", "dev", "eth0"); !strings.Contains(out, addrOf(t, res, false).String()+"/24") {
			t.Fatalf("pod eth0 lacks %s after the new ADD:\n%s", addrOf(t, res, false), out)
		}
		n.mustDel(t, again)
	}
	n.requireClean(t)
}

// TestFailureAfterAllocationLeavesNothingBehind makes the last step of an
// ADD with a hostPort fail, once everything is set up: the plugin writes
// its result to a full device (/dev/full), as to a runtime gone away.
func TestFailureAfterAllocationLeavesNothingBehind(t *testing.T) {
	n := newNode(t, nodeOpts{})
	pod := netns.New(t, "pod")
	r := rt(pod, "fails")
	r.CapabilityArgs = map[string]any{"portMappings": []map[string]any{{"hostPort": 30998, "containerPort": 80}}}
	conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"netplane","type":"netplane-cni","bridge":"cni0","mtu":1400,`+
		`"podCIDRs":["10.244.1.0/24"],"stateDir":%q,"runtimeConfig":{"portMappings":[{"hostPort":30998,"containerPort":80,"protocol":"tcp"}]}}`, n.stateDir)
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer full.Close()
	cmd := n.ns.Command(pluginDir(t) + "/netplane-cni")
	cmd.Env = []string{"CNI_COMMAND=ADD", "CNI_CONTAINERID=" + r.ContainerID, "CNI_NETNS=" + pod.Path, "CNI_IFNAME=eth0", "CNI_PATH=" + pluginDir(t)}
	cmd.Stdin, cmd.Stdout = strings.NewReader(conf), full
	if err := cmd.Run(); err == nil {
		t.Fatal("ADD succeeded though its result could not be written")
	}
	n.requireClean(t)
	if _, err := handle(t, pod).LinkByName("eth0"); err == nil {
		t.Fatal("pod eth0 left behind")
	}
	// The runtime follows every ADD, failed or not, with a DEL.
	n.mustDel(t, r)
	n.requireClean(t)
}

func TestCheckFailsWhenAnyPieceIsRemoved(t *testing.T) {
	n := newNode(t, nodeOpts{})
	for _, tc := range []struct {
		name   string
		remove func(t *testing.T, pod *netns.NS, cid string)
	}{
		{"pod eth0", func(t *testing.T, pod *netns.NS, _ string) { pod.MustExec(t, "ip", "link", "del", "eth0") }},
		{"host veth", func(t *testing.T, _ *netns.NS, cid string) {
			n.ns.MustExec(t, "ip", "link", "set", plugin.VethName(cid, "eth0"), "nomaster")
		}},
		{"pod address", func(t *testing.T, pod *netns.NS, _ string) { pod.MustExec(t, "ip", "addr", "flush", "dev", "eth0") }},
		{"default route", func(t *testing.T, pod *netns.NS, _ string) { pod.MustExec(t, "ip", "route", "del", "default") }},
		{"bridge gateway", func(t *testing.T, _ *netns.NS, _ string) { n.ns.MustExec(t, "ip", "addr", "flush", "dev", "cni0") }},
		{"IPAM record", func(t *testing.T, _ *netns.NS, cid string) {
			if err := (&ipam.Store{Dir: n.stateDir, BootID: bootID(t)}).Update(func(st *ipam.State) error {
				st.Release(cid, "eth0")
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := netns.New(t, "pod")
			r := rt(pod, "check-"+strings.ReplaceAll(tc.name, " ", "-"))
			n.mustAdd(t, r)
			if err := n.check(r); err != nil {
				t.Fatalf("CHECK before removing: %v", err)
			}
			tc.remove(t, pod, r.ContainerID)
			err := n.check(r)
			if err == nil {
				t.Fatalf("CHECK passed after removing the %s", tc.name)
			}
			t.Logf("CHECK: %v", err)
			if tc.name == "IPAM record" && cniCode(err) != types.ErrUnknownContainer {
				t.Fatalf("CHECK without a record: code %d, want 3 (unknown container)", cniCode(err))
			}
			n.mustDel(t, r)
		})
	}
}

func TestExhaustedRangeFailsWithACodedErrorAndRecoversAfterDel(t *testing.T) {
	n := newNode(t, nodeOpts{podCIDRs: []string{"10.244.9.0/29"}})
	var rts []*libcni.RuntimeConf
	for i := range 5 { // .2 to .6
		r := rt(netns.New(t, "pod"), fmt.Sprint("full-", i))
		n.mustAdd(t, r)
		rts = append(rts, r)
	}
	_, err := n.add(rt(netns.New(t, "pod"), "one-too-many"))
	if cniCode(err) != types.ErrTryAgainLater || !strings.Contains(err.Error(), "10.244.9.0/29 is full") {
		t.Fatalf("ADD into a full range: %v (code %d), want code 11 naming the range", err, cniCode(err))
	}
	n.mustDel(t, rts[2])
	res := n.mustAdd(t, rt(netns.New(t, "pod"), "after-del"))
	if got := res.IPs[0].Address.IP.String(); got != "10.244.9.4" {
		t.Fatalf("after DEL got %s, want the freed 10.244.9.4", got)
	}
}

func TestParallelAddsGetUniqueAddresses(t *testing.T) {
	pods := 200
	if testing.Short() {
		pods = 20
	}
	n := newNode(t, nodeOpts{podCIDRs: []string{"10.244.0.0/22", "fd00:10:244::/64"}})
	rts := make([]*libcni.RuntimeConf, pods)
	for i := range rts {
		rts[i] = rt(netns.New(t, "pod"), fmt.Sprint("par-", i))
	}
	results := make([]*current.Result, pods)
	errs := make([]error, pods)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range rts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			var raw types.Result
			raw, errs[i] = n.add(rts[i])
			if errs[i] == nil {
				results[i], errs[i] = current.NewResultFromResult(raw)
			}
		}()
	}
	wg.Wait()
	seen := map[string]string{}
	for i, res := range results {
		if errs[i] != nil {
			t.Fatalf("ADD %d: %v", i, errs[i])
		}
		for _, ip := range res.IPs {
			if other, dup := seen[ip.Address.IP.String()]; dup {
				t.Fatalf("%s given to %s and %s", ip.Address.IP, other, rts[i].ContainerID)
			}
			seen[ip.Address.IP.String()] = rts[i].ContainerID
		}
	}
	// And the kernel agrees: each pod holds exactly the address it was given.
	for i, res := range results[:10] {
		p := handle(t, &netns.NS{Name: "pod", Path: rts[i].NetNS})
		eth0, err := p.LinkByName("eth0")
		if err != nil {
			t.Fatal(err)
		}
		addrs, _ := p.AddrList(eth0, netlink.FAMILY_V4)
		if len(addrs) != 1 || !addrs[0].IP.Equal(res.IPs[0].Address.IP) {
			t.Fatalf("pod %d has %v, result says %v", i, addrs, res.IPs[0].Address)
		}
	}
	if v := n.veths(t); len(v) != pods {
		t.Fatalf("%d host veths for %d pods", len(v), pods)
	}
}

func TestChurnLeavesNoRecordVethOrRule(t *testing.T) {
	n := newNode(t, nodeOpts{})
	const pods, rounds = 20, 3
	var wg sync.WaitGroup
	errs := make(chan error, pods*rounds)
	var nss []*netns.NS
	for i := range pods {
		pod := netns.New(t, "pod")
		nss = append(nss, pod)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range rounds {
				r := rt(pod, fmt.Sprintf("churn-%d-%d", i, j))
				if i%5 == 0 {
					r.CapabilityArgs = map[string]any{"portMappings": []map[string]any{{"hostPort": 31000 + i, "containerPort": 80}}}
				}
				if _, err := n.add(r); err != nil {
					errs <- err
				}
				if err := n.del(r); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	n.requireClean(t)
	for _, pod := range nss {
		if _, err := handle(t, pod).LinkByName("eth0"); err == nil {
			t.Fatalf("%s keeps an eth0 after every attachment in it was deleted", pod.Name)
		}
	}
}

func TestGCReleasesEveryAttachmentNotListedAsValid(t *testing.T) {
	n := newNode(t, nodeOpts{})
	a, b := rt(netns.New(t, "pod"), "gc-a"), rt(netns.New(t, "pod"), "gc-b")
	n.mustAdd(t, a)
	n.mustAdd(t, b)
	// A fresh libcni cache knows nothing of b, as after a runtime lost its
	// state: only the plugin's own GC can reclaim it.
	fresh := newCNI(n.cni.Path, t.TempDir())
	gc := func(valid ...*libcni.RuntimeConf) {
		t.Helper()
		args := &libcni.GCArgs{}
		for _, v := range valid {
			args.ValidAttachments = append(args.ValidAttachments, types.GCAttachment{ContainerID: v.ContainerID, IfName: v.IfName})
		}
		if err := n.do(func(ctx context.Context) error { return fresh.GCNetworkList(ctx, n.list, args) }); err != nil {
			t.Fatalf("GC: %v", err)
		}
	}
	gc(a)
	st := n.state(t)
	if len(st.Attachments) != 1 || st.Attachments[0].ContainerID != "gc-a" {
		t.Fatalf("after GC valid={a}: %+v", st.Attachments)
	}
	if err := n.check(a); err != nil {
		t.Fatalf("a broken by GC: %v", err)
	}
	if v := n.veths(t); len(v) != 1 || v[0] != plugin.VethName("gc-a", "eth0") {
		t.Fatalf("veths after GC: %v", v)
	}
	gc()
	n.requireClean(t)
}

func TestStatusIsReadyOnlyWithAPodCIDRAndABridge(t *testing.T) {
	n := newNode(t, nodeOpts{})
	status := func(list *libcni.NetworkConfigList) error {
		return n.do(func(ctx context.Context) error { return n.cni.GetStatusNetworkList(ctx, list) })
	}
	if err := status(n.list); cniCode(err) != types.ErrPluginNotAvailable {
		t.Fatalf("STATUS before the bridge exists: %v, want code 50", err)
	}
	n.mustAdd(t, rt(netns.New(t, "pod"), "status"))
	if err := status(n.list); err != nil {
		t.Fatalf("STATUS when ready: %v", err)
	}
	empty := n.conflist(t, nodeOpts{podCIDRs: []string{}})
	if err := status(empty); cniCode(err) != types.ErrPluginNotAvailable {
		t.Fatalf("STATUS without pod CIDR: %v, want code 50", err)
	}
}

func TestBadInputGetsCodedErrors(t *testing.T) {
	n := newNode(t, nodeOpts{})
	pod := netns.New(t, "pod")
	conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"netplane","type":"netplane-cni","mtu":1500,"podCIDRs":["10.244.1.0/24"],"stateDir":%q}`, n.stateDir)
	for _, tc := range []struct {
		name, stdin, ifname string
		code                uint
	}{
		{"bad interface name", conf, "eth0/x", types.ErrInvalidEnvironmentVariables},
		{"not JSON", "{nope", "eth0", types.ErrDecodingFailure},
		{"no network name", strings.Replace(conf, `"name":"netplane",`, "", 1), "eth0", types.ErrInvalidNetworkConfig},
		{"unsupported version", strings.Replace(conf, "1.0.0", "0.1.0", 1), "eth0", types.ErrIncompatibleCNIVersion},
		{"delegated ipam", strings.Replace(conf, `"podCIDRs"`, `"ipam":{"type":"host-local"},"podCIDRs"`, 1), "eth0", types.ErrUnsupportedField},
		{"bad pod CIDR", strings.Replace(conf, "10.244.1.0/24", "10.244.1.0/31", 1), "eth0", types.ErrInvalidNetworkConfig},
		{"no MTU: the node role decides it", strings.Replace(conf, `"mtu":1500,`, "", 1), "eth0", types.ErrInvalidNetworkConfig},
		{"an MTU no interface takes", strings.Replace(conf, `"mtu":1500,`, `"mtu":67,`, 1), "eth0", types.ErrInvalidNetworkConfig},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := n.ns.Command(pluginDir(t) + "/netplane-cni")
			cmd.Env = []string{"CNI_COMMAND=ADD", "CNI_CONTAINERID=bad", "CNI_NETNS=" + pod.Path, "CNI_IFNAME=" + tc.ifname, "CNI_PATH=" + pluginDir(t)}
			cmd.Stdin = strings.NewReader(tc.stdin)
			out, err := cmd.Output()
			if _, ok := err.(*exec.ExitError); !ok {
				t.Fatalf("plugin exit: %v, output %s", err, out)
			}
			if !strings.Contains(string(out), fmt.Sprintf(`"code": %d`, tc.code)) {
				t.Fatalf("output %s, want code %d", out, tc.code)
			}
		})
	}
	n.requireClean(t)
}

// A CNI_NETNS that cannot be opened is the runtime's error (code 4, naming
// the variable), in ADD and in CHECK, and ADD allocates nothing for it.
func TestAnUnopenableNetnsIsTheRuntimesError(t *testing.T) {
	n := newNode(t, nodeOpts{})
	missing := "/run/netns/netplane-test-missing"
	r := rt(nil, "no-netns")
	r.NetNS = missing
	_, err := n.add(r)
	if cniCode(err) != types.ErrInvalidEnvironmentVariables || !strings.Contains(err.Error(), "CNI_NETNS="+missing) {
		t.Fatalf("ADD: %v (code %d), want code 4 naming CNI_NETNS", err, cniCode(err))
	}
	if st := n.state(t); len(st.Attachments) != 0 {
		t.Fatalf("records after a failed ADD: %+v", st.Attachments)
	}
	ok := rt(netns.New(t, "pod"), "netns-gone-for-check")
	n.mustAdd(t, ok)
	moved := *ok
	moved.NetNS = missing
	if err := n.check(&moved); cniCode(err) != types.ErrInvalidEnvironmentVariables || !strings.Contains(err.Error(), "CNI_NETNS="+missing) {
		t.Fatalf("CHECK: %v (code %d), want code 4 naming CNI_NETNS", err, cniCode(err))
	}
	n.mustDel(t, ok)
	n.requireClean(t)
}
