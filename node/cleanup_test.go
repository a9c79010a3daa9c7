package node_test

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netplane/netplane/cni/conflist"
	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/testcluster"
)

func TestMain(m *testing.M) { framework.Main(m) }

// The phases of node1's agent before a cleanup, each making what the
// others do not: the first everything but the direct routes and the
// WireGuard guard table, with pods; the second direct routes to node2
// (both nodes share a subnet); the third the guard table of strict
// encryption. node2 runs the first's flags throughout, as a WireGuard peer.
var phases = []struct {
	name  string
	flags []string
	made  []string // lines of the node's state the agent must have made
	pods  bool
}{{
	name:  "VXLAN, permissive WireGuard, NetworkPolicy and a hostPort",
	flags: []string{"--overlay=always", "--encryption=wireguard", "--wireguard-permissive"},
	made: []string{"table ip netplane", "table ip6 netplane", "table inet netplane-pods", "table inet netplane-policy",
		"table inet netplane-hostports", "link cni0 bridge", "link netplane.vxlan vxlan", "link netplane.wg tuntap",
		"link npv", "rule v4 100 lookup 208", "dev netplane.wg", "file ipam/lock", "file bin/netplane-cni",
		"file net.d/00-netplane.conflist", "file wireguard/private.key"},
	pods: true,
}, {
	name:  "direct routes",
	flags: []string{"--overlay=cross-subnet"},
	made:  []string{"route table 254 10.244.2.0/24 via 192.168.77.12 dev eth0 proto 207"},
}, {
	name:  "strict WireGuard",
	flags: []string{"--encryption=wireguard"},
	made:  []string{"table inet netplane-wg", "route table 208 10.244.2.0/24 dev netplane.wg proto 208"},
}}

// TestCleanupLeavesNoTraceAndANewAgentRebuilds runs node1's agent in each
// phase, stops it as `helm uninstall` would, and runs the real
// `netplane --role=node --cleanup` in node1's namespace: afterwards the
// node's nftables tables, links, routes, rules and files are exactly what
// they were before any agent ran, with what others made there (a table,
// a bridge, a route, a rule, files in the CNI folders) still in place; a
// second cleanup is a no-op. An agent started afterwards builds it all
// again, and a pod made then reaches node2's pod and back.
func TestCleanupLeavesNoTraceAndANewAgentRebuilds(t *testing.T) {
	// NoDAD: eth0's IPv6 link-local address, and its route, are there
	// before the first snapshot, not after.
	c := testcluster.New(t, testcluster.Options{NoStart: true, NoDAD: true})
	n1, n2 := c.Nodes[0], c.Nodes[1]
	for _, n := range c.Nodes {
		// The host's folders, as the chart's hostPath volumes make them.
		for _, d := range []string{n.ConfDir(), n.BinDir(), filepath.Dir(keyFile(n))} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	plantOthers(t, n1)
	before := snapshot(t, n1)
	c.Start(t, n2, agentFlags(n2, phases[0].flags)...)
	c.WaitForCNI(t, n2)
	allowIngressFromAAndB(t, c)
	server := addPod(t, c, n2, "pod-b")

	for _, ph := range phases {
		t.Run(ph.name, func(t *testing.T) {
			c.Start(t, n1, agentFlags(n1, ph.flags)...)
			c.WaitForCNI(t, n1)
			if ph.pods {
				client := addPod(t, c, n1, "pod-a", conflist.PortMapping{HostPort: 8081, ContainerPort: 8080, Protocol: "tcp"})
				expectReach(t, client, server)
				expectReach(t, server, client)
			}
			awaitMade(t, n1, ph.made)
			c.Stop(n1)
			start := time.Now()
			out := cleanup(t, n1)
			t.Logf("cleanup took %v:\n%s", time.Since(start), out)
			if diff := compare(before, snapshot(t, n1)); diff != "" {
				t.Errorf("after the cleanup the node differs from before the agent ran:\n%s", diff)
			}
			if out := cleanup(t, n1); strings.TrimSpace(out) != "nothing to remove" {
				t.Errorf("second cleanup: %q, want %q", out, "nothing to remove")
			}
		})
	}

	t.Run("a new agent rebuilds", func(t *testing.T) {
		c.Start(t, n1, agentFlags(n1, phases[0].flags)...)
		c.WaitForCNI(t, n1)
		client := addPod(t, c, n1, "pod-a2")
		expectReach(t, client, server)
		expectReach(t, server, client)
		awaitMade(t, n1, []string{"table ip netplane", "table inet netplane-pods", "table inet netplane-policy",
			"link cni0 bridge", "link netplane.vxlan vxlan", "link netplane.wg tuntap"})
	})
}

func keyFile(n *testcluster.Node) string { return filepath.Join(n.Dir, "wireguard", "private.key") }

// agentFlags are node n's agent flags in a phase: WireGuard in userspace,
// as no test machine is assumed to have the kernel's.
func agentFlags(n *testcluster.Node, phase []string) []string {
	return append([]string{"--min-sync-period=100ms", "--wireguard-implementation=userspace",
		"--wireguard-private-key-file=" + keyFile(n)}, phase...)
}

// cleanup runs `netplane --role=node --cleanup` in n's namespace with the
// folders its agent was given, and returns what it printed; it fails the
// test unless it exits 0 with nothing on stderr. Every path is passed:
// the defaults are the machine's own.
func cleanup(t *testing.T, n *testcluster.Node) string {
	t.Helper()
	cmd := n.NS.Command(filepath.Join(framework.NetplaneBinaries(t), "netplane"), "--role=node", "--cleanup",
		"--node-name="+n.Name, "--cni-conf-dir="+n.ConfDir(), "--cni-bin-dir="+n.BinDir(),
		"--ipam-state-dir="+n.IPAMDir(), "--wireguard-private-key-file="+keyFile(n))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil || stderr.Len() > 0 {
		t.Fatalf("netplane --cleanup: %v\nstdout:\n%s\nstderr:\n%s", err, &stdout, &stderr)
	}
	return stdout.String()
}

// plantOthers makes in n what other software would: none of it is the
// node role's, so a cleanup must leave it.
func plantOthers(t *testing.T, n *testcluster.Node) {
	t.Helper()
	for _, cmd := range [][]string{
		{"nft", "add", "table", "inet", "other"},
		{"ip", "link", "add", "other0", "type", "bridge"},
		{"ip", "link", "add", "other1", "type", "veth", "peer", "name", "other2"},
		{"ip", "route", "add", "10.99.0.0/24", "via", "192.168.77.254", "proto", "static"},
		{"ip", "rule", "add", "priority", "300", "lookup", "300"},
	} {
		n.NS.MustExec(t, cmd[0], cmd[1:]...)
	}
	for _, f := range []string{filepath.Join(n.ConfDir(), "10-other.conflist"), filepath.Join(n.BinDir(), "loopback")} {
		if err := os.WriteFile(f, []byte("not netplane's\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// snapshot is n's state as sorted lines: nftables tables, links with their
// kind, routes of every table, rules, and the files under n's folder
// that the agent may write to (its CNI folders, IPAM store, key).
func snapshot(t *testing.T, n *testcluster.Node) []string {
	t.Helper()
	var out []string
	for _, l := range strings.Split(n.NS.MustExec(t, "nft", "list", "tables"), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	var h *netlink.Handle
	if err := n.NS.Do(func() (err error) { h, err = netlink.NewHandle(unix.NETLINK_ROUTE); return err }); err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	names := map[int]string{}
	for _, l := range links {
		names[l.Attrs().Index] = l.Attrs().Name
		out = append(out, fmt.Sprintf("link %s %s", l.Attrs().Name, l.Type()))
	}
	routes, err := h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range routes {
		out = append(out, routeLine(r, names))
	}
	rules, err := h.RuleList(netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rules {
		fam := map[int]string{unix.AF_INET: "v4", unix.AF_INET6: "v6"}[r.Family]
		out = append(out, fmt.Sprintf("rule %s %d lookup %d", fam, r.Priority, r.Table))
	}
	for _, d := range []string{"net.d", "bin", "ipam", "wireguard"} {
		err := filepath.WalkDir(filepath.Join(n.Dir, d), func(path string, e fs.DirEntry, err error) error {
			if err == nil {
				rel, _ := filepath.Rel(n.Dir, path)
				out = append(out, map[bool]string{true: "folder ", false: "file "}[e.IsDir()]+rel)
			}
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(out)
	return out
}

func routeLine(r netlink.Route, names map[int]string) string {
	s := fmt.Sprintf("route table %d ", r.Table)
	if r.Dst != nil {
		s += r.Dst.String()
	} else {
		s += "default"
	}
	if r.Gw != nil {
		s += " via " + r.Gw.String()
	}
	if r.LinkIndex > 0 {
		s += " dev " + names[r.LinkIndex]
	}
	return s + fmt.Sprintf(" proto %d type %d", r.Protocol, r.Type)
}

// compare lists the lines only before has (-) and only after has (+).
func compare(before, after []string) string {
	var b strings.Builder
	for _, l := range before {
		if !slices.Contains(after, l) {
			b.WriteString("- " + l + "\n")
		}
	}
	for _, l := range after {
		if !slices.Contains(before, l) {
			b.WriteString("+ " + l + "\n")
		}
	}
	return b.String()
}

// awaitMade waits until each of made starts a line of n's state.
func awaitMade(t *testing.T, n *testcluster.Node, made []string) {
	t.Helper()
	framework.Eventually(t, 60*time.Second, "what the agent makes on "+n.Name, func() error {
		state := snapshot(t, n)
		for _, m := range made {
			if !slices.ContainsFunc(state, func(l string) bool { return strings.HasPrefix(l, m) || strings.Contains(l, " "+m) }) {
				return fmt.Errorf("no %q among:\n%s", m, strings.Join(state, "\n"))
			}
		}
		return nil
	})
}

// addPod makes a pod labelled app=<its name> serving the echo servers on
// 8080, and its API object, which NetworkPolicy reads.
func addPod(t *testing.T, c *testcluster.Cluster, n *testcluster.Node, name string, ports ...conflist.PortMapping) *testcluster.Pod {
	t.Helper()
	p := c.AddPodWithHostPorts(t, n, name, ports...)
	p.NS.ServeEcho(t, ":8080", name)
	app := strings.TrimRight(name, "0123456789")
	c.WritePod(t, &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Labels: map[string]string{"app": app}},
		Spec:   v1.PodSpec{NodeName: n.Name, Containers: []v1.Container{{Name: "echo", Image: "registry.invalid/none"}}},
		Status: testcluster.Running(p.IP)})
	return p
}

// allowIngressFromAAndB isolates every pod of default for ingress but from
// pods labelled app=pod-a and app=pod-b, so the policy table has rules.
func allowIngressFromAAndB(t *testing.T, c *testcluster.Cluster) {
	t.Helper()
	from := func(app string) networkingv1.NetworkPolicyPeer {
		return networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}}
	}
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "from-a-and-b"},
		Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{from("pod-a"), from("pod-b")}}}}}
	if _, err := c.API.Client.NetworkingV1().NetworkPolicies("default").Create(c.Ctx, np, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// expectReach waits until from's pod gets an answer from to's echo server.
func expectReach(t *testing.T, from, to *testcluster.Pod) {
	t.Helper()
	framework.Eventually(t, 30*time.Second, from.ID+" reaches "+to.ID, func() error {
		answer, err := from.NS.Ask("tcp", net.JoinHostPort(to.IP, "8080"), time.Second)
		if err == nil && !strings.HasPrefix(answer, to.ID+" ") {
			err = fmt.Errorf("answer %q", answer)
		}
		return err
	})
}
