package plugin_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/vishvananda/netlink"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/netplane/netplane/cni/plugin"
	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
)

// echoServers answers TCP and UDP on port inside ns with "<name> <data>".
func echoServers(t *testing.T, ns *netns.NS, name string, port int) {
	t.Helper()
	l, err := ns.Listen(fmt.Sprintf(":%d", port))
	if err != nil {
		t.Fatal(err)
	}
	var pc net.PacketConn
	if err := ns.Do(func() error {
		var err error
		pc, err = net.ListenPacket("udp", fmt.Sprintf(":%d", port))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	framework.Serve(t, l, func(c net.Conn) {
		line, _ := bufio.NewReader(c).ReadString('\n')
		fmt.Fprintf(c, "%s %s", name, line)
	})
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo([]byte(name+" "+string(buf[:n])), from)
		}
	}()
}

// ask sends "ping\n" over network to addr from inside ns and returns the answer.
func ask(ns *netns.NS, network, addr string) (string, error) {
	var answer string
	err := ns.Do(func() error {
		c, err := net.DialTimeout(network, addr, 2*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := io.WriteString(c, "ping\n"); err != nil {
			return err
		}
		buf := make([]byte, 100)
		n, err := c.Read(buf)
		answer = strings.TrimSpace(string(buf[:n]))
		return err
	})
	return answer, err
}

// askEventually retries ask for a few seconds: the first packets to a new
// pod may wait for neighbour resolution.
func askEventually(t *testing.T, ns *netns.NS, network, addr, want string) {
	t.Helper()
	var got string
	var err error
	if wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		got, err = ask(ns, network, addr)
		return err == nil && got == want, nil
	}) != nil {
		t.Fatalf("%s %s from %s: got %q, %v; want %q", network, addr, ns.Name, got, err, want)
	}
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
	echoServers(t, a, "a", 8080)

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
			askEventually(t, tc.from, "tcp", tc.addr+":30080", "a ping")
			askEventually(t, tc.from, "udp", tc.addr+":30053", "a ping")
		})
	}
	t.Run("node localhost", func(t *testing.T) {
		askEventually(t, n.ns, "tcp", "127.0.0.1:30080", "a ping")
		askEventually(t, n.ns, "udp", "127.0.0.1:30053", "a ping")
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
	askEventually(t, ext, "tcp", "192.168.50.1:30080", "a ping")
	n.mustDel(t, rc)
	n.mustDel(t, ra)
	if n.hostPortTable(t) {
		t.Fatal("hostPort table still there after the last DEL")
	}
	if _, err := ask(ext, "tcp", "192.168.50.1:30080"); err == nil {
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
	var out string
	if wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		out = a.MustExec(t, "ip", "-6", "addr", "show", "dev", "eth0")
		return !strings.Contains(out, "tentative"), nil
	}) != nil {
		t.Fatalf("link-local address still tentative 5 s after ADD:\n%s", out)
	}
	resB := n.mustAdd(t, rt(b, "ds-b"))
	v6b := addrOf(t, resB, true)
	if v6b != netip.MustParseAddr("fd00:10:244:1::3") {
		t.Fatalf("second pod's IPv6 %s", v6b)
	}
	echoServers(t, b, "b", 9000)
	askEventually(t, a, "tcp", net.JoinHostPort(v6b.String(), "9000"), "b ping")
	askEventually(t, a, "tcp", net.JoinHostPort(addrOf(t, resB, false).String(), "9000"), "b ping")
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
	echoServers(t, pod, "p", 8080)

	askEventually(t, ext, "tcp", "192.168.50.1:30090", "p ping")
	askEventually(t, ext, "udp", "192.168.50.1:30090", "p ping")
	askEventually(t, n.ns, "tcp", "192.168.50.1:30090", "p ping")
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
				if got, err := ask(tc.from, network, tc.addr+":30090"); err == nil {
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
