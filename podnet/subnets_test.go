package podnet_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/podnet"
)

// The VXLAN port and VNI the cluster runs with: not the defaults, so the
// wire shows the flags are honoured.
const (
	vxlanPort = 8472
	vxlanVNI  = 42
)

// vxlanDevice is the overlay's IPv4 VXLAN device as an operator finds it
// in `ip link`. The test reads the kernel by the names and formats the
// overlay documents (overlay/README.md), not through the overlay's code:
// no node feature imports another, tests included.
const vxlanDevice = "netplane.vxlan"

// vxlanMAC is the tunnel MAC of the node whose IPv4 underlay address is ip:
// 0e:6e and the address's four bytes.
func vxlanMAC(ip string) string {
	b := netip.MustParseAddr(ip).As4()
	return fmt.Sprintf("0e:6e:%02x:%02x:%02x:%02x", b[0], b[1], b[2], b[3])
}

var tunnelFlags = []string{"--vxlan-port=" + strconv.Itoa(vxlanPort), "--vxlan-vni=" + strconv.Itoa(vxlanVNI)}

// The agents start with no periodic resync, so that what follows a Node
// change can only be the reaction to its event; after the restart they
// resync every 2 s, which is what heals what others delete.
const (
	eventsOnly = "--sync-period=1h"
	resyncing  = "--sync-period=2s"
)

// TestPodNetworkSpansTwoSubnets runs the node role on three nodes, two on
// one subnet and one behind a router, through the overlay's modes and a
// restart. It is one long sequence of subtests on one cluster, each step
// building on the one before: the cluster (API server, namespaces, three
// agents, pods) takes longer to build than all the checks take to run.
func TestPodNetworkSpansTwoSubnets(t *testing.T) {
	c := newCluster(t, append([]string{eventsOnly}, tunnelFlags...)...)
	for _, n := range c.nodes {
		probe(t, n.NS, vxlanPort, vxlanVNI)
	}
	// The underlay is 1500 bytes and dual-stack: pods get 1500 less the
	// IPv6 encapsulation's 70.
	var pods []*pod
	for i, n := range c.nodes {
		pods = append(pods, n.addPod(t, fmt.Sprintf("pod-%d", i+1), 1430))
	}
	n1 := c.node(1)

	t.Run("pod to pod both ways within and across subnets keeps the pod's address", func(t *testing.T) {
		for _, pair := range [][2]int{{0, 1}, {1, 0}, {0, 2}, {2, 0}, {1, 2}, {2, 1}} {
			from, to := pods[pair[0]], pods[pair[1]]
			for _, fam := range []int{4, 6} {
				expectWho(t, from.NS, "tcp", to.at(fam, echoPort), from.address(fam))
				expectWho(t, from.NS, "udp", to.at(fam, echoPort), from.address(fam))
			}
		}
	})

	t.Run("same-subnet traffic goes direct, cross-subnet traffic through VXLAN on the flags' port and VNI", func(t *testing.T) {
		for dst, want := range map[string]string{
			"10.244.2.0/24":      "10.244.2.0/24 via 192.168.10.12 dev eth0",
			"fd00:10:244:2::/64": "fd00:10:244:2::/64 via fd00:a::12 dev eth0",
			"10.244.3.0/24":      "10.244.3.0/24 via 192.168.20.13 dev netplane.vxlan onlink",
		} {
			fam := "-4"
			if strings.Contains(dst, ":") {
				fam = "-6"
			}
			if got := n1.shows("ip", fam, "route", "show", "root", dst, "proto", "207"); !strings.HasPrefix(got, want) {
				t.Errorf("node1's route of protocol 207 to %s: %q, want %q", dst, got, want)
			}
		}
		if got := n1.shows("ip", "-d", "link", "show", vxlanDevice); !strings.Contains(got, fmt.Sprintf("vxlan id %d ", vxlanVNI)) ||
			!strings.Contains(got, fmt.Sprintf("dstport %d ", vxlanPort)) || !strings.Contains(got, "nolearning") {
			t.Errorf("%s: %s\nwant vxlan id %d, dstport %d, nolearning", vxlanDevice, got, vxlanVNI, vxlanPort)
		}
		before := count(t, n1.NS, "vxlan")
		for range 5 {
			expectWho(t, pods[0].NS, "tcp", pods[1].at(4, echoPort), pods[0].IP)
			expectWho(t, pods[0].NS, "tcp", pods[1].at(6, echoPort), pods[0].IP6)
		}
		if after := count(t, n1.NS, "vxlan"); after != before {
			t.Errorf("node1 sent %d VXLAN packets for traffic to a pod on its subnet, want none", after-before)
		}
		before, vni := count(t, n1.NS, "vxlan"), count(t, n1.NS, "vni")
		expectWho(t, pods[0].NS, "tcp", pods[2].at(4, echoPort), pods[0].IP)
		expectWho(t, pods[0].NS, "tcp", pods[2].at(6, echoPort), pods[0].IP6)
		if all, ours := count(t, n1.NS, "vxlan")-before, count(t, n1.NS, "vni")-vni; ours == 0 || ours != all {
			t.Errorf("node1 sent %d packets to UDP %d with VNI %d and %d to UDP %d in all for traffic to node3's pod; want some, all with the VNI",
				ours, vxlanPort, vxlanVNI, all, vxlanPort)
		}
	})

	t.Run("1 MB each way across the overlay", func(t *testing.T) {
		for _, pair := range [][2]int{{0, 2}, {2, 1}} {
			for _, fam := range []int{4, 6} {
				if err := pods[pair[0]].NS.EchoBytes(pods[pair[1]].at(fam, echoPort), 1<<20); err != nil {
					t.Errorf("pod-%d to pod-%d over IPv%d: %v", pair[0]+1, pair[1]+1, fam, err)
				}
			}
		}
	})

	t.Run("a ClusterIP and NodePorts whose only backend is across the overlay", func(t *testing.T) {
		cluster := service(t, c, "across", false, pods[2].IP, "node3")
		local := service(t, c, "local", true, pods[2].IP, "node3")
		clusterIP := net.JoinHostPort(cluster.Spec.ClusterIP, "80")
		expectWho(t, pods[0].NS, "tcp", clusterIP, pods[0].IP)
		expectWho(t, n1.NS, "tcp", clusterIP, "10.244.1.0") // the tunnel device's address
		nodePort := strconv.Itoa(int(cluster.Spec.Ports[0].NodePort))
		framework.Eventually(t, 20*time.Second, "NodePort of node1 from outside", func() error {
			got, err := who(c.ext, "tcp", net.JoinHostPort(n1.IP, nodePort))
			if err == nil {
				t.Logf("the backend saw the NodePort client through node1 at %s", got)
			}
			return err
		})
		localPort := strconv.Itoa(int(local.Spec.Ports[0].NodePort))
		expectWho(t, c.ext, "tcp", net.JoinHostPort(c.node(3).IP, localPort), "192.168.10.100")
	})

	t.Run("bridged pod-to-pod traffic passes netfilter: a Service's backend on the client's own node", func(t *testing.T) {
		for _, key := range []string{"net.bridge.bridge-nf-call-iptables", "net.bridge.bridge-nf-call-ip6tables"} {
			if got := n1.shows("sysctl", "-n", key); got != "1" {
				t.Errorf("node1's %s is %q, want 1", key, got)
			}
		}
		// The backend answers the client over the bridge: without the
		// bridge's packets in netfilter, the answer would skip the reverse
		// translation and come from the backend's own address.
		neighbour := n1.addPod(t, "pod-1b", 1430)
		svc := service(t, c, "samenode", false, neighbour.IP, "node1")
		expectWho(t, pods[0].NS, "tcp", net.JoinHostPort(svc.Spec.ClusterIP, "80"), pods[0].IP)
	})

	c.ext.ServeEcho(t, ":"+echoPort, "ext")
	t.Run("pod egress leaving the cluster is masqueraded", func(t *testing.T) {
		expectWho(t, pods[0].NS, "tcp", "192.168.10.100:"+echoPort, n1.IP)
		expectWho(t, pods[2].NS, "tcp", "192.168.10.100:"+echoPort, c.node(3).IP)
		expectWho(t, pods[2].NS, "tcp", "[fd00:a::64]:"+echoPort, c.node(3).IP6)
	})

	t.Run("a Node added, readdressed and deleted", func(t *testing.T) {
		nodeComesChangesAndGoes(t, c)
	})

	t.Run("a connection across the overlay survives a restart of the node role", func(t *testing.T) {
		connectionSurvivesARestart(t, c, pods)
	})

	t.Run("routes, entries and the masquerade table deleted by someone else come back", func(t *testing.T) {
		mac := vxlanMAC(c.node(3).IP)
		n1.NS.MustExec(t, "ip", "route", "del", "10.244.3.0/24")
		n1.NS.MustExec(t, "ip", "neigh", "del", c.node(3).IP, "dev", vxlanDevice)
		n1.NS.MustExec(t, "bridge", "fdb", "del", mac, "dev", vxlanDevice, "dst", c.node(3).IP)
		n1.NS.MustExec(t, "nft", "delete", "table", "inet", podnet.MasqTable.Name)
		framework.Eventually(t, 10*time.Second, "node1's entries for node3 and its masquerade table", func() error {
			switch {
			case !strings.Contains(n1.shows("ip", "route", "show", "10.244.3.0/24"), "dev netplane.vxlan"):
				return fmt.Errorf("no route")
			case !strings.Contains(n1.shows("ip", "neigh", "show", c.node(3).IP, "dev", vxlanDevice), "lladdr "+mac+" PERMANENT"):
				return fmt.Errorf("no neighbour")
			case !strings.Contains(n1.shows("bridge", "fdb", "show", "dev", vxlanDevice), mac+" dst "+c.node(3).IP):
				return fmt.Errorf("no FDB entry")
			case !strings.Contains(n1.shows("nft", "list", "table", "inet", podnet.MasqTable.Name), "masquerade"):
				return fmt.Errorf("no masquerade table")
			}
			return nil
		})
		expectWho(t, pods[0].NS, "tcp", pods[2].at(4, echoPort), pods[0].IP)
		expectWho(t, pods[0].NS, "tcp", "192.168.10.100:"+echoPort, n1.IP)
	})

	t.Run("metrics count remote nodes per path", func(t *testing.T) {
		metrics := scrape(t, n1)
		for _, want := range []string{
			`netplane_overlay_remote_nodes{family="IPv4",path="direct"} 1`,
			`netplane_overlay_remote_nodes{family="IPv4",path="vxlan"} 1`,
			`netplane_overlay_remote_nodes{family="IPv6",path="vxlan"} 1`,
		} {
			if !strings.Contains(metrics, want) {
				t.Errorf("node1's metrics lack %q", want)
			}
		}
		if at := lastSync(t, n1); time.Since(at) > 10*time.Second {
			t.Errorf("node1's last overlay sync at %v, more than 10 s ago with --sync-period=2s", at)
		}
	})

	t.Run("switched to always, same-subnet traffic is encapsulated too", func(t *testing.T) {
		c.stop()
		c.start(t, append([]string{"--overlay=always", resyncing}, tunnelFlags...)...)
		framework.Eventually(t, 10*time.Second, "node1's route to node2's pods through the tunnel", func() error {
			if got := n1.shows("ip", "route", "show", "10.244.2.0/24"); !strings.Contains(got, "dev netplane.vxlan") {
				return fmt.Errorf("route %q", got)
			}
			return nil
		})
		before := count(t, n1.NS, "vni")
		expectWho(t, pods[0].NS, "tcp", pods[1].at(4, echoPort), pods[0].IP)
		expectWho(t, pods[0].NS, "tcp", pods[1].at(6, echoPort), pods[0].IP6)
		expectWho(t, pods[1].NS, "udp", pods[0].at(4, echoPort), pods[1].IP)
		if count(t, n1.NS, "vni") == before {
			t.Errorf("no VXLAN packet from node1 for traffic to a pod on its subnet under always")
		}
		expectWho(t, pods[0].NS, "tcp", pods[2].at(4, echoPort), pods[0].IP)
	})

	t.Run("switched to never, the router cannot carry pod traffic and the far node is reported", func(t *testing.T) {
		c.stop()
		c.start(t, "--overlay=never", resyncing)
		framework.Eventually(t, 10*time.Second, "node1 without tunnel and route to node3's pods", func() error {
			if got := n1.shows("ip", "route", "show", "10.244.3.0/24"); got != "" {
				return fmt.Errorf("route %q", got)
			}
			if got := n1.shows("ip", "link", "show", vxlanDevice); got != "" {
				return fmt.Errorf("device %q", got)
			}
			return nil
		})
		expectWho(t, pods[0].NS, "tcp", pods[1].at(4, echoPort), pods[0].IP)
		unreachable(t, pods[0].NS, pods[2].at(4, echoPort))
		unreachable(t, pods[2].NS, pods[1].at(6, echoPort))
		framework.Eventually(t, 20*time.Second, "PodCIDRNotRoutable event on node3", func() error {
			evs, err := c.API.Client.CoreV1().Events("default").List(framework.Ctx(t), metav1.ListOptions{FieldSelector: "reason=PodCIDRNotRoutable"})
			if err != nil {
				return err
			}
			for _, e := range evs.Items {
				if e.InvolvedObject.Name == "node3" && e.Type == v1.EventTypeWarning {
					return nil
				}
			}
			return fmt.Errorf("%d events, none about node3", len(evs.Items))
		})
		framework.Eventually(t, 10*time.Second, "the underlay's MTU in node1's conflist", func() error {
			b, err := os.ReadFile(filepath.Join(n1.ConfDir(), podnet.ConflistName))
			if err != nil || !strings.Contains(string(b), `"mtu": 1500`) {
				return fmt.Errorf("conflist %s (%v)", b, err)
			}
			return nil
		})
	})
}

// service makes a NodePort Service (port 80 to 8080; with
// externalTrafficPolicy Local if local) whose one endpoint is backend on
// node, and its EndpointSlice (as the controller would).
func service(t *testing.T, c *cluster, name string, local bool, backend, node string) *v1.Service {
	t.Helper()
	ctx := framework.Ctx(t)
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, Spec: v1.ServiceSpec{
		Type:  v1.ServiceTypeNodePort,
		Ports: []v1.ServicePort{{Name: "tcp", Port: 80, Protocol: v1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)}},
	}}
	if local {
		svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	}
	svc, err := c.API.Client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ready, port := true, int32(8080)
	slice := &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name + "-1", Namespace: "default", Labels: map[string]string{discovery.LabelServiceName: name}},
		AddressType: discovery.AddressTypeIPv4,
		Endpoints:   []discovery.Endpoint{{Addresses: []string{backend}, Conditions: discovery.EndpointConditions{Ready: &ready}, NodeName: &node}},
		Ports:       []discovery.EndpointPort{{Name: ptr("tcp"), Port: &port, Protocol: ptr(v1.ProtocolTCP)}},
	}
	if _, err := c.API.Client.DiscoveryV1().EndpointSlices("default").Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return svc
}

// nodeComesChangesAndGoes: a Node object of a node behind the router (no
// machine behind it) gets node1's route, neighbour and FDB entry within a
// moment of its InternalIP; they follow a new address and go with it. The
// agents run without periodic resync here: each change is the reaction to
// the Node's event.
func nodeComesChangesAndGoes(t *testing.T, c *cluster) {
	n1 := c.node(1)
	h := n1.NS.Netlink(t)
	ctx := framework.Ctx(t)
	cidrs := []string{"10.244.4.0/24"}
	node, err := c.API.Client.CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node4"},
		Spec: v1.NodeSpec{PodCIDR: cidrs[0], PodCIDRs: cidrs}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	routed := func(via string) func() error {
		return func() error {
			rs, err := h.RouteGet(netipAddr("10.244.4.7").AsSlice())
			if err != nil || len(rs) != 1 || rs[0].Gw.String() != via {
				return fmt.Errorf("route to 10.244.4.7: %v (%v), want via %s", rs, err, via)
			}
			return nil
		}
	}
	start := time.Now()
	c.SetAddresses(t, node, "192.168.20.14")
	framework.EventuallyEvery(t, 2*time.Millisecond, 10*time.Second, "node1's route to node4's pods", routed("192.168.20.14"))
	t.Logf("node4's InternalIP written to its route in node1's kernel: %v", time.Since(start).Round(time.Millisecond))
	want := func(ip string) string {
		return fmt.Sprintf("%s dst %s", vxlanMAC(ip), ip)
	}
	if got := n1.shows("bridge", "fdb", "show", "dev", vxlanDevice); !strings.Contains(got, want("192.168.20.14")) {
		t.Errorf("node1's FDB: %s\nwant %s", got, want("192.168.20.14"))
	}

	node, err = c.API.Client.CoreV1().Nodes().Get(ctx, "node4", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	c.SetAddresses(t, node, "192.168.20.24")
	framework.EventuallyEvery(t, 2*time.Millisecond, 10*time.Second, "node1's route to node4's pods via its new address", routed("192.168.20.24"))
	t.Logf("node4's new InternalIP to its route in node1's kernel: %v", time.Since(start).Round(time.Millisecond))
	fdb := n1.shows("bridge", "fdb", "show", "dev", vxlanDevice)
	neigh := n1.shows("ip", "neigh", "show", "dev", vxlanDevice)
	if !strings.Contains(fdb, want("192.168.20.24")) || strings.Contains(fdb, "192.168.20.14") || strings.Contains(neigh, "192.168.20.14 ") {
		t.Errorf("node1's FDB %q and neighbours %q after the change; want the new address's only", fdb, neigh)
	}

	start = time.Now()
	if err := c.API.Client.CoreV1().Nodes().Delete(ctx, "node4", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	framework.EventuallyEvery(t, 2*time.Millisecond, 10*time.Second, "node1's route to node4's pods gone", func() error {
		if rs, err := h.RouteGet(netipAddr("10.244.4.7").AsSlice()); err != nil || len(rs) != 1 || rs[0].Gw.String() == "192.168.20.24" {
			return fmt.Errorf("route to 10.244.4.7: %v (%v)", rs, err)
		}
		return nil
	})
	t.Logf("node4 deleted to its route gone from node1's kernel: %v", time.Since(start).Round(time.Millisecond))
	framework.Eventually(t, 10*time.Second, "node1 without anything of node4", func() error {
		for _, s := range []string{n1.shows("ip", "route", "show", "proto", "207"), n1.shows("ip", "neigh", "show", "dev", vxlanDevice),
			n1.shows("bridge", "fdb", "show", "dev", vxlanDevice)} {
			if strings.Contains(s, "10.244.4.0") || strings.Contains(s, "192.168.20.24") {
				return fmt.Errorf("still there: %s", s)
			}
		}
		return nil
	})
}

// connectionSurvivesARestart: SIGTERM leaves the devices, routes and
// entries in place, an open pod connection across the overlay keeps
// working while the agents are down and after they are back, and the new
// agents adopt the devices instead of recreating them.
func connectionSurvivesARestart(t *testing.T, c *cluster, pods []*pod) {
	conn := hold(t, pods[0].NS, pods[2].at(4, echoPort))
	ask := func(when string) {
		t.Helper()
		if got, err := conn.Seen(); err != nil || got != pods[0].IP {
			t.Fatalf("the open connection %s: %q, %v; want the pod's address %s", when, got, err, pods[0].IP)
		}
	}
	ask("before the restart")
	state := func() string {
		var b strings.Builder
		for _, n := range []*clusterNode{c.node(1), c.node(3)} {
			for _, args := range [][]string{{"ip", "-o", "link", "show", vxlanDevice}, {"ip", "route", "show", "proto", "207"},
				{"ip", "-6", "route", "show", "proto", "207"}, {"ip", "neigh", "show", "nud", "permanent"}, {"bridge", "fdb", "show", "dev", vxlanDevice}} {
				fmt.Fprintf(&b, "%s: %s\n", n.Name, n.shows(args...))
			}
		}
		return b.String()
	}
	before := state()
	c.stop()
	if after := state(); after != before {
		t.Errorf("a stop changed the kernel:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	ask("while the agents are stopped")
	restarted := time.Now()
	c.start(t, append([]string{resyncing}, tunnelFlags...)...)
	for _, n := range []*clusterNode{c.node(1), c.node(3)} {
		// The first sync of an agent is a full one.
		framework.Eventually(t, 10*time.Second, "a sync of the restarted agent on "+n.Name, func() error {
			if at := lastSync(t, n); at.Before(restarted) {
				return fmt.Errorf("last sync at %v", at)
			}
			return nil
		})
	}
	ask("after the restart")
	if after := state(); after != before {
		t.Errorf("the restarted agents changed the kernel (a device recreated?):\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// scrape reads the metrics of the node's netplane, served inside its
// namespace, and checks /healthz on the way.
func scrape(t *testing.T, n *clusterNode) string {
	t.Helper()
	health, metrics := framework.ServedAddresses(t, n.Proc, 10*time.Second)
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(_ context.Context, network, addr string) (net.Conn, error) { return n.NS.Dial(network, addr) },
	}}
	if code, body, err := framework.HTTPGet(client, "http://"+health+"/healthz"); err != nil || code != http.StatusOK {
		t.Errorf("%s's /healthz: %d %s (%v)", n.Name, code, body, err)
	}
	resp, err := client.Get("http://" + metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// lastSync is when the overlay of the node's netplane last synced, by its
// metric; zero before its first sync (the series then does not exist).
func lastSync(t *testing.T, n *clusterNode) time.Time {
	t.Helper()
	m := regexp.MustCompile(`(?m)^netplane_node_last_sync_timestamp_seconds\{feature="overlay"\} (\S+)$`).FindStringSubmatch(scrape(t, n))
	if m == nil {
		return time.Time{}
	}
	at, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return time.Unix(0, int64(at*1e9))
}

func ptr[T any](v T) *T { return &v }

func netipAddr(s string) netip.Addr { return netip.MustParseAddr(s) }
