package policy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
	"github.com/netplane/netplane/e2e/testcluster"
	"github.com/netplane/netplane/nft"
)

// The layout on the real kernel: the node of a testcluster with a bridge
// and br_netfilter's bridge-nf-call-iptables on, four pod namespaces on it
// (x/a, x/b, y/a, y/b) serving TCP and UDP on 80 and 81, the model's dump
// loaded with nft, real connections. Each probe's result is compared with
// the API reading and with what the case states.

// lab is the node and its pods.
type lab struct {
	t    testing.TB
	node *netns.NS
	pods map[string]*netns.NS // "x/a" → namespace
	ips  map[string]string
	c    *cluster
	// With a driver, load renders the model and programs it through the
	// nft driver, as the node role does, instead of loading the dump.
	driver *nft.Programmer
	render *renderer
	dialer nft.Dialer
}

var labPods = []struct{ key, ip, ip6 string }{{"x/a", "10.244.0.2", "fd00:244::2"}, {"x/b", "10.244.0.3", "fd00:244::3"},
	{"y/a", "10.244.0.4", "fd00:244::4"}, {"y/b", "10.244.0.5", "fd00:244::5"}}

func newLab(t testing.TB) *lab { return newLabVia(t, false) }

// newLabVia is the lab, programmed through the driver when driver is set.
func newLabVia(t testing.TB, driver bool) *lab {
	framework.RequireRoot(t)
	framework.RequireBinary(t, "nft")
	_, err := os.Stat("/proc/sys/net/bridge")
	framework.Require(t, err == nil, "br_netfilter is not loaded (modprobe br_netfilter)")
	tc := testcluster.New(t, testcluster.Options{Nodes: 1, NoAPIServer: true})
	l := &lab{t: t, node: tc.Nodes[0].NS, pods: map[string]*netns.NS{}, ips: map[string]string{},
		c: newCluster([]string{"n1"}, nil)}
	l.node.Sysctl(t, "net.bridge.bridge-nf-call-iptables", "1")
	l.node.Sysctl(t, "net.bridge.bridge-nf-call-ip6tables", "1")
	for _, ns := range []string{"x", "y"} {
		l.c.setNamespace(modelNamespace(ns))
	}
	for _, lp := range labPods {
		ns, name, _ := strings.Cut(lp.key, "/")
		pod := tc.AddHandPod(t, tc.Nodes[0], testcluster.HandPod{Label: "pol" + ns + name, Bridge: "br0",
			IPs: []string{lp.ip + "/24", lp.ip6 + "/64"}}).NS
		l.pods[lp.key], l.ips[lp.key] = pod, lp.ip
		for _, port := range []int{80, 81} {
			serve(t, pod, fmt.Sprintf(":%d", port))
		}
		p := modelPod(ns, name)
		p.Spec.NodeName = "n1"
		p.Status.PodIPs = []v1.PodIP{{IP: lp.ip}, {IP: lp.ip6}}
		l.c.setPod(p)
	}
	serve(t, l.node, "10.244.0.1:80")
	if driver {
		d, closeNS, err := nft.NamespaceDialer(l.node.Path)
		if err != nil {
			t.Fatal(err)
		}
		l.dialer, l.driver, l.render = d, nft.NewProgrammer(d, TableID), newRenderer(l.c.models["n1"].Table())
		t.Cleanup(func() { l.driver.Close(); closeNS() })
	}
	l.load()
	return l
}

// serve runs the echo servers (netns.ServeEcho) on addr inside ns until
// the test ends; ":port" serves both families.
func serve(t testing.TB, ns *netns.NS, addr string) { ns.ServeEcho(t, addr, ns.Name) }

// load replaces the node's table with the model's, atomically, or
// programs what changed through the driver.
func (l *lab) load() {
	l.t.Helper()
	if l.driver != nil {
		var err error
		if tc := l.c.models["n1"].TakeTouched(); tc == nil || l.render.t == nil {
			_, err = l.driver.Sync(l.render.full(), true)
		} else {
			_, err = l.driver.SyncTouched(l.render.t, l.render.apply(tc))
		}
		if err != nil {
			l.t.Fatalf("programming through the driver: %v", err)
		}
		return
	}
	l.nft(l.t, "add table inet "+TableName+"\ndelete table inet "+TableName+"\n"+l.c.models["n1"].Table().Dump())
}

// nft runs `nft -f -` with input in the node.
func (l *lab) nft(t testing.TB, input string) {
	t.Helper()
	cmd := l.node.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(input)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft -f: %v: %s\ninput:\n%.2000s", err, out, input)
	}
}

// connect opens a connection from a pod (or "node") to addr and sees an
// echo: true if it got through.
func (l *lab) connect(from, network, addr string) bool {
	ns := l.node
	if from != "node" {
		ns = l.pods[from]
	}
	var c net.Conn
	err := ns.Do(func() error {
		var err error
		c, err = net.DialTimeout(network, addr, 400*time.Millisecond)
		return err
	})
	if err != nil {
		return false
	}
	defer c.Close()
	return echoes(c)
}

// echoes asks the echo server over c (TCP or UDP) and says whether it
// answered.
func echoes(c net.Conn) bool {
	c.SetDeadline(time.Now().Add(400 * time.Millisecond))
	if _, err := io.WriteString(c, "ask\n"); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && line != ""
}

// kprobe is a connection and whether it must get through; to is a pod or
// an address:port, backend the pod that serves it (for the reference).
type kprobe struct {
	from, to string
	port     int
	proto    v1.Protocol
	want     bool
	backend  string
}

// check makes every probe at once and compares with want and, for
// pod-to-pod probes, with the API reading.
func (l *lab) check(probes ...kprobe) {
	l.t.Helper()
	got := l.probeAll(probes)
	for i, p := range probes {
		if got[i] != p.want {
			l.t.Errorf("%s -> %s %s/%d: got through=%v, want %v", p.from, p.to, p.proto, p.port, got[i], p.want)
		}
		to := p.to
		if p.backend != "" {
			to = p.backend
		}
		if _, isPod := l.ips[to]; isPod && p.from != "node" {
			if api := l.c.allowed(l.c.endpoint(l.t, p.from), l.c.endpoint(l.t, to), int32(p.port), p.proto); api != p.want {
				l.t.Errorf("%s -> %s %s/%d: the API reading says %v, the case %v", p.from, to, p.proto, p.port, api, p.want)
			}
		}
	}
}

// denied is how many packets the table denied in direction d.
func (l *lab) denied(d Direction) uint64 {
	if l.driver != nil {
		n, err := deniedPackets(namespaceCounter{l.dialer})()
		if err != nil {
			l.t.Fatal(err)
		}
		return n[d]
	}
	out := l.node.MustExec(l.t, "nft", "list", "counter", "inet", TableName, CounterName(d))
	_, after, _ := strings.Cut(out, "packets ")
	n, _ := strconv.ParseUint(strings.Fields(after)[0], 10, 64)
	return n
}

// TestKernelEnforcesTheLayout loads the model's tables as nft text and,
// rendered, through the driver.
func TestKernelEnforcesTheLayout(t *testing.T) {
	for _, via := range []string{"nft text", "driver"} {
		t.Run(via, func(t *testing.T) { kernelEnforces(t, newLabVia(t, via == "driver")) })
	}
}

func kernelEnforces(t *testing.T, l *lab) {
	t.Run("without policies everything gets through", func(t *testing.T) {
		l.check(kprobe{"y/a", "x/a", 80, tcp, true, ""}, kprobe{"x/a", "y/b", 81, udp, true, ""})
	})
	t.Run("ingress from y/b on TCP 80 only, bridged and from the node", func(t *testing.T) {
		l.c.setPolicy(t, policy("x", "deny", netv1.NetworkPolicySpec{PodSelector: *all, PolicyTypes: ingressOnly}))
		l.c.setPolicy(t, policy("x", "allow", netv1.NetworkPolicySpec{PodSelector: *sel("pod", "a"),
			Ingress: []netv1.NetworkPolicyIngressRule{ingress(peers(bothPeer(sel("ns", "y"), sel("pod", "b"))), namedPort(tcp, "serve-80-tcp"))}}))
		l.load()
		l.check(kprobe{"y/b", "x/a", 80, tcp, true, ""}, kprobe{"y/b", "x/a", 81, tcp, false, ""},
			kprobe{"y/a", "x/a", 80, tcp, false, ""}, kprobe{"x/b", "x/a", 80, tcp, false, ""},
			kprobe{"y/b", "x/a", 80, udp, false, ""}, kprobe{"x/a", "y/a", 80, tcp, true, ""},
			kprobe{"node", "x/a", 81, tcp, true, ""})
		// Over IPv6 the same, which needs neighbour discovery to pass the isolation.
		if !l.connect("y/b", "tcp6", "[fd00:244::2]:80") || l.connect("y/a", "tcp6", "[fd00:244::2]:80") {
			t.Errorf("over IPv6, y/b -> x/a tcp/80 must get through and y/a -> x/a must not")
		}
		if n := l.denied(Ingress); n == 0 {
			t.Errorf("denied ingress counted nothing")
		}
	})
	t.Run("without bridge-nf-call-iptables bridged traffic bypasses the forward hook", func(t *testing.T) {
		l.node.Sysctl(t, "net.bridge.bridge-nf-call-iptables", "0")
		defer l.node.Sysctl(t, "net.bridge.bridge-nf-call-iptables", "1")
		if !l.connect("y/a", "tcp4", "10.244.0.2:80") {
			t.Errorf("y/a -> x/a got through=false with bridge-nf-call-iptables=0: the layout's documented dependency changed")
		}
	})
	t.Run("established connections survive a policy change", func(t *testing.T) {
		l.c.deletePolicy(podKey("x", "deny"))
		l.c.deletePolicy(podKey("x", "allow"))
		l.load()
		var c net.Conn
		err := l.pods["y/a"].Do(func() error {
			var err error
			c, err = net.DialTimeout("tcp4", "10.244.0.3:81", time.Second)
			return err
		})
		if err != nil || !echoes(c) {
			t.Fatalf("y/a -> x/b before the change: %v", err)
		}
		defer c.Close()
		l.c.setPolicy(t, policy("x", "deny", netv1.NetworkPolicySpec{PodSelector: *all, PolicyTypes: ingressOnly}))
		l.load()
		if !echoes(c) {
			t.Errorf("the established connection y/a -> x/b was cut by the policy change")
		}
		l.check(kprobe{"y/a", "x/b", 81, tcp, false, ""})
	})
	t.Run("egress is judged in forward and, to the node itself, in input", l.egress)
	t.Run("a Service VIP is judged on its backend after DNAT", func(t *testing.T) {
		l.nft(t, "table ip svc-test {\n chain prerouting {\n  type nat hook prerouting priority -100; policy accept;\n"+
			"  ip daddr 10.96.0.10 tcp dport 80 dnat to 10.244.0.2:80\n }\n}\n")
		l.c.setPolicy(t, policy("x", "allow", netv1.NetworkPolicySpec{PodSelector: *sel("pod", "a"),
			Ingress: []netv1.NetworkPolicyIngressRule{ingress(peers(podPeer(sel("pod", "b"))), port(tcp, 80))}}))
		l.load()
		l.check(kprobe{"x/b", "10.96.0.10", 80, tcp, true, "x/a"}, kprobe{"y/a", "10.96.0.10", 80, tcp, false, "x/a"},
			kprobe{"y/b", "10.96.0.10", 80, tcp, false, "x/a"})
	})
}

// egress: y/a may send UDP 81 to x/b only; its node is reached through
// input, where an ipBlock of the node's address allows it.
func (l *lab) egress(t *testing.T) {
	l.c.setPolicy(t, policy("y", "egress", netv1.NetworkPolicySpec{PodSelector: *sel("pod", "a"), PolicyTypes: egressOnly,
		Egress: []netv1.NetworkPolicyEgressRule{egress(peers(bothPeer(sel("ns", "x"), sel("pod", "b"))), port(udp, 81))}}))
	l.c.deletePolicy(podKey("x", "deny"))
	l.load()
	l.check(kprobe{"y/a", "x/b", 81, udp, true, ""}, kprobe{"y/a", "x/b", 81, tcp, false, ""},
		kprobe{"y/a", "x/a", 81, udp, false, ""}, kprobe{"y/a", "10.244.0.1", 80, tcp, false, ""}, kprobe{"y/b", "10.244.0.1", 80, tcp, true, ""})
	l.c.setPolicy(t, policy("y", "node", netv1.NetworkPolicySpec{PodSelector: *sel("pod", "a"), PolicyTypes: egressOnly,
		Egress: []netv1.NetworkPolicyEgressRule{egress(peers(blockPeer("10.244.0.1/32")), port(tcp, 80))}}))
	l.load()
	l.check(kprobe{"y/a", "10.244.0.1", 80, tcp, true, ""})
	if !l.connect("y/a", "udp6", "[fd00:244::3]:81") || l.connect("y/a", "tcp6", "[fd00:244::3]:81") {
		t.Errorf("over IPv6, y/a -> x/b udp/81 must get through and tcp/81 must not")
	}
	l.c.deletePolicy(podKey("y", "egress"))
	l.c.deletePolicy(podKey("y", "node"))
}

func TestKernelAcceptsTheLoggingHook(t *testing.T) {
	framework.RequireRoot(t)
	framework.RequireBinary(t, "nft")
	node := netns.New(t, "pollog")
	m := NewModel(Config{Node: "n1", Log: Log{Group: 5, Rate: 10, Prefix: "netplane-policy denied "}})
	cmd := node.Command("nft", "-c", "-f", "-")
	cmd.Stdin = strings.NewReader(m.Table().Dump())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft -c refused the table with logging: %v: %s\n%s", err, out, m.Table().Dump())
	}
}

func TestMain(m *testing.M) { framework.Main(m) }

// namespaceCounter reads the table's counters in a lab's namespace.
type namespaceCounter struct{ d nft.Dialer }

func (c namespaceCounter) Packets(chains ...string) (map[string]uint64, error) {
	return nft.Packets(c.d, TableID, chains...)
}

// probeAll makes every probe at once and says which got through.
func (l *lab) probeAll(probes []kprobe) []bool {
	got := make([]bool, len(probes))
	var wg sync.WaitGroup
	for i, p := range probes {
		addr := p.to
		if ip, ok := l.ips[p.to]; ok {
			addr = ip
		}
		wg.Go(func() {
			got[i] = l.connect(p.from, strings.ToLower(string(p.proto))+"4", fmt.Sprintf("%s:%d", addr, p.port))
		})
	}
	wg.Wait()
	return got
}
