package plugin_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/vishvananda/netlink"

	"github.com/netplane/netplane/cni/plugin"
	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
)

// askEventually asks the echo server (netns.ServeEcho) at addr over
// network from ns until the server named want answers: the first packets
// to a new pod may wait for neighbour resolution.
func askEventually(t *testing.T, ns *netns.NS, network, addr, want string) {
	t.Helper()
	framework.Eventually(t, 20*time.Second, fmt.Sprintf("%s %s from %s answered by %s", network, addr, ns.Name, want), func() error {
		got, err := ns.Ask(network, addr, netns.EchoTimeout)
		if name, _ := netns.SplitAnswer(got); err != nil || name != want {
			return fmt.Errorf("got %q, %v", got, err)
		}
		return nil
	})
}

func TestHostPortsForwardTCPAndUDPFromOutsideLocalhostOtherPodsAndThePodItself(t *testing.T) {
	n := newNode(t, nodeOpts{podCIDRs: []string{"10.244.1.0/24", "fd00:10:244:1::/64"}})
	n.ns.Sysctl(t, "net.ipv4.ip_forward", "1")
	n.ns.Sysctl(t, "net.ipv6.conf.all.forwarding", "1")
	ext := netns.Host(t, "ext", n.ns, "uplink", "eth0")
	n.ns.Addr(t, "uplink", "192.168.50.1/24")
	n.ns.Addr(t, "uplink", "fd00:50::1/64")
	ext.Addr(t, "eth0", "192.168.50.2/24")
	ext.Addr(t, "eth0", "fd00:50::2/64")

	a, b := netns.New(t, "pod"), netns.New(t, "pod")
	ra := rt(a, "hp-a")
	ra.CapabilityArgs = map[string]any{"portMappings": []map[string]any{
		{"hostPort": 30080, "containerPort": 8080, "protocol": "tcp"},
		{"hostPort": 30053, "containerPort": 8080, "protocol": "UDP"},
	}}
	n.mustAdd(t, ra)
	n.mustAdd(t, rt(b, "hp-b"))
	a.ServeEcho(t, ":8080", "a")

	for _, tc := range []struct {
		from *netns.NS
		who  string
		addr string
	}{
		{ext, "outside", "192.168.50.1"},
		{n.ns, "the node", "192.168.50.1"},
		{b, "another pod", "192.168.50.1"},
		{a, "the pod itself (hairpin)", "192.168.50.1"},
		{a, "the pod itself via the gateway", "10.244.1.1"},
		{ext, "outside over IPv6", "[fd00:50::1]"},
		{b, "another pod over IPv6", "[fd00:50::1]"},
		{a, "the pod itself over IPv6", "[fd00:50::1]"},
	} {
		t.Run(tc.who, func(t *testing.T) {
			askEventually(t, tc.from, "tcp", tc.addr+":30080", "a")
			askEventually(t, tc.from, "udp", tc.addr+":30053", "a")
		})
	}
	t.Run("node localhost", func(t *testing.T) {
		askEventually(t, n.ns, "tcp", "127.0.0.1:30080", "a")
		askEventually(t, n.ns, "udp", "127.0.0.1:30053", "a")
	})
	if err := n.check(ra); err != nil {
		t.Fatalf("CHECK: %v", err)
	}
	if !n.hostPortTable(t) {
		t.Fatal("hostPort table missing while a pod has host ports")
	}
	// CHECK notices the rules are gone; the next change of host ports restores them.
	n.ns.MustExec(t, "nft", "delete", "table", "inet", plugin.HostPortTable.Name)
	if err := n.check(ra); err == nil {
		t.Fatal("CHECK passed without the hostPort table")
	}
	rc := rt(netns.New(t, "pod"), "hp-c")
	rc.CapabilityArgs = map[string]any{"portMappings": []map[string]any{{"hostPort": 30081, "containerPort": 8080}}}
	n.mustAdd(t, rc)
	askEventually(t, ext, "tcp", "192.168.50.1:30080", "a")
	n.mustDel(t, rc)
	n.mustDel(t, ra)
	if n.hostPortTable(t) {
		t.Fatal("hostPort table still there after the last DEL")
	}
	if _, err := ext.Ask("tcp", "192.168.50.1:30080", netns.EchoTimeout); err == nil {
		t.Fatal("hostPort still answers after DEL")
	}
}

func TestDualStackPodHasUsableIPv6WhenAddReturns(t *testing.T) {
	n := newNode(t, nodeOpts{podCIDRs: []string{"10.244.1.0/24", "fd00:10:244:1::/64"}})
	a, b := netns.New(t, "pod"), netns.New(t, "pod")
	resA := n.mustAdd(t, rt(a, "ds-a"))
	if len(resA.IPs) != 2 {
		t.Fatalf("IPs %v, want one per family", resA.IPs)
	}
	// Right after ADD, before anything else: the pod's address is usable,
	// not tentative. (The kernel's own link-local address may still wait a
	// moment for the carrier event; DAD is off, so it never waits longer.)
	if out := a.MustExec(t, "ip", "-6", "addr", "show", "dev", "eth0", "scope", "global"); !strings.Contains(out, "fd00:10:244:1::2/64") || strings.Contains(out, "tentative") {
		t.Fatalf("pod IPv6 address missing or tentative right after ADD:\n%s", out)
	}
	framework.EventuallyEvery(t, 20*time.Millisecond, 5*time.Second, "the link-local address usable after ADD", func() error {
		if out := a.MustExec(t, "ip", "-6", "addr", "show", "dev", "eth0"); strings.Contains(out, "tentative") {
			return fmt.Errorf("still tentative:\n%s", out)
		}
		return nil
	})
	resB := n.mustAdd(t, rt(b, "ds-b"))
	v6b := addrOf(t, resB, true)
	if v6b != netip.MustParseAddr("fd00:10:244:1::3") {
		t.Fatalf("second pod's IPv6 %s", v6b)
	}
	b.ServeEcho(t, ":9000", "b")
	askEventually(t, a, "tcp", net.JoinHostPort(v6b.String(), "9000"), "b")
	askEventually(t, a, "tcp", net.JoinHostPort(addrOf(t, resB, false).String(), "9000"), "b")
	// The pod reaches the gateway over IPv6 too.
	a.MustExec(t, "ping", "-6", "-c1", "-W2", "fd00:10:244:1::1")
	routes, _ := handle(t, a).RouteList(nil, netlink.FAMILY_V6)
	found := false
	for _, r := range routes {
		if r.Gw.String() == "fd00:10:244:1::1" {
			found = true
		}
	}
	if !found {
		t.Fatalf("no IPv6 default route via the gateway: %v", routes)
	}
}

func TestVersionListsTheSupportedSpecVersions(t *testing.T) {
	n := newNode(t, nodeOpts{})
	var got []string
	err := n.do(func(ctx context.Context) error {
		info, err := n.cni.GetVersionInfo(ctx, "netplane-cni")
		if err == nil {
			got = info.SupportedVersions()
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, ",") != "0.4.0,1.0.0,1.1.0" {
		t.Fatalf("supported versions %v", got)
	}
}

func TestHostPortWithHostIPForwardsOnlyOnThatAddress(t *testing.T) {
	n := newNode(t, nodeOpts{})
	n.ns.Sysctl(t, "net.ipv4.ip_forward", "1")
	ext := netns.Host(t, "ext", n.ns, "uplink", "eth0")
	n.ns.Addr(t, "uplink", "192.168.50.1/24")
	n.ns.Addr(t, "uplink", "192.168.50.3/24") // another address of the node
	ext.Addr(t, "eth0", "192.168.50.2/24")

	pod := netns.New(t, "pod")
	r := rt(pod, "hostip")
	r.CapabilityArgs = map[string]any{"portMappings": []map[string]any{
		{"hostPort": 30090, "containerPort": 8080, "protocol": "tcp", "hostIP": "192.168.50.1"},
		{"hostPort": 30090, "containerPort": 8080, "protocol": "udp", "hostIP": "192.168.50.1"},
	}}
	n.mustAdd(t, r)
	pod.ServeEcho(t, ":8080", "p")

	askEventually(t, ext, "tcp", "192.168.50.1:30090", "p")
	askEventually(t, ext, "udp", "192.168.50.1:30090", "p")
	askEventually(t, n.ns, "tcp", "192.168.50.1:30090", "p")
	for _, tc := range []struct {
		from *netns.NS
		who  string
		addr string
	}{
		{ext, "outside, to the node's other address", "192.168.50.3"},
		{n.ns, "the node, to its other address", "192.168.50.3"},
		{n.ns, "the node, to localhost", "127.0.0.1"},
	} {
		t.Run(tc.who, func(t *testing.T) {
			for _, network := range []string{"tcp", "udp"} {
				if got, err := tc.from.Ask(network, tc.addr+":30090", netns.EchoTimeout); err == nil {
					t.Errorf("%s %s:30090 answered %q; the mapping is for 192.168.50.1 only", network, tc.addr, got)
				}
			}
		})
	}
	if err := n.check(r); err != nil {
		t.Fatalf("CHECK: %v", err)
	}
	n.mustDel(t, r)
	n.requireClean(t)
}

func TestCheckFailsWhenOneOfThePodsHostPortRulesIsRemoved(t *testing.T) {
	table := plugin.HostPortTable.Name
	for _, tc := range []struct {
		name   string
		delete func(t *testing.T, n *node)
		want   string // in CHECK's error
	}{
		{"the pod's TCP rule", func(t *testing.T, n *node) { deleteRule(t, n, "hostports", "tcp dport 30080 ") },
			`"meta nfproto ipv4 fib daddr type local meta l4proto tcp th dport 30080 dnat ip to 10.244.1.2:8080" is missing`},
		{"the pod's UDP rule", func(t *testing.T, n *node) { deleteRule(t, n, "hostports", "udp dport 30053 ") },
			`"meta nfproto ipv4 fib daddr type local meta l4proto udp th dport 30053 dnat ip to 10.244.1.2:8080" is missing`},
		{"the jump from prerouting", func(t *testing.T, n *node) { deleteRule(t, n, "prerouting", "jump hostports") },
			"chain prerouting of table inet netplane-hostports does not jump"},
		{"the output chain", func(t *testing.T, n *node) {
			n.ns.MustExec(t, "nft", "delete", "chain", "inet", table, "output")
		}, "the hostPort table inet netplane-hostports is incomplete (chain output of table inet netplane-hostports: file does not exist)"},
		{"the table", func(t *testing.T, n *node) {
			n.ns.MustExec(t, "nft", "delete", "table", "inet", table)
		}, "the hostPort table inet netplane-hostports is incomplete (chain prerouting of table inet netplane-hostports: file does not exist)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t, nodeOpts{})
			ra, rb := rt(netns.New(t, "pod"), "hp-a"), rt(netns.New(t, "pod"), "hp-b")
			ra.CapabilityArgs = map[string]any{"portMappings": []map[string]any{
				{"hostPort": 30080, "containerPort": 8080, "protocol": "tcp"},
				{"hostPort": 30053, "containerPort": 8080, "protocol": "udp"},
			}}
			rb.CapabilityArgs = map[string]any{"portMappings": []map[string]any{{"hostPort": 30081, "containerPort": 8080}}}
			n.mustAdd(t, ra)
			n.mustAdd(t, rb)
			for _, r := range []*libcni.RuntimeConf{ra, rb} {
				if err := n.check(r); err != nil {
					t.Fatalf("CHECK %s before: %v", r.ContainerID, err)
				}
			}
			tc.delete(t, n)
			err := n.check(ra)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("CHECK after deleting %s: %v, want an error containing %q", tc.name, err, tc.want)
			}
			// The next change of host ports on the node restores the rules.
			n.mustDel(t, rb)
			if err := n.check(ra); err != nil {
				t.Fatalf("CHECK after the table was rewritten: %v", err)
			}
		})
	}
}

// deleteRule deletes the first rule of chain whose `nft list` line
// contains text.
func deleteRule(t *testing.T, n *node, chain, text string) {
	t.Helper()
	out := n.ns.MustExec(t, "nft", "-a", "list", "chain", "inet", plugin.HostPortTable.Name, chain)
	for _, line := range strings.Split(out, "\n") {
		_, handle, ok := strings.Cut(line, "# handle ")
		if ok && strings.Contains(line, text) {
			n.ns.MustExec(t, "nft", "delete", "rule", "inet", plugin.HostPortTable.Name, chain, "handle", strings.TrimSpace(handle))
			return
		}
	}
	t.Fatalf("no rule with %q in chain %s:\n%s", text, chain, out)
}
