package policy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	v1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/nft"
)

var (
	denyIngressX = policy("x", "deny", netv1.NetworkPolicySpec{PodSelector: *all, PolicyTypes: ingressOnly})
	denyEgressX  = policy("x", "deny-egress", netv1.NetworkPolicySpec{PodSelector: *all, PolicyTypes: egressOnly})
)

// xaFrom: x/a admits from alone.
func xaFrom(name string, from ...netv1.NetworkPolicyPeer) *netv1.NetworkPolicy {
	return policy("x", name, netv1.NetworkPolicySpec{PodSelector: *sel("pod", "a"),
		Ingress: []netv1.NetworkPolicyIngressRule{ingress(from)}})
}

// matrixCases are cases of policies alone: each sets the cluster's
// policies to its own and checks the truth table.
var matrixCases = []struct {
	name     string
	policies []*netv1.NetworkPolicy
	spots    []stated
}{
	{"no policy allows everything", nil, []stated{allow("y/a", "x/a", tcp, 80), allow("x/a", "ext", tcp, 80), allow("node2", "x/a", tcp, 81)}},
	{"default deny ingress isolates the namespace, not its egress nor its node", []*netv1.NetworkPolicy{denyIngressX},
		[]stated{deny("y/a", "x/a", tcp, 80), deny("x/b", "x/a", udp, 81), allow("x/a", "y/a", tcp, 80), deny("ext", "x/c", tcp, 80),
			allow("node1", "x/a", tcp, 81), deny("node2", "x/a", tcp, 81), deny("y/a", "svc", tcp, 80)}},
	{"default deny egress lets replies back", []*netv1.NetworkPolicy{denyEgressX},
		[]stated{deny("x/a", "y/a", tcp, 80), deny("x/a", "ext", tcp, 80), allow("y/a", "x/a", tcp, 80), allow("y/a", "x/a", udp, 81)}},
	{"default deny both ways", []*netv1.NetworkPolicy{policy("x", "deny", netv1.NetworkPolicySpec{PodSelector: *all, PolicyTypes: bothTypes})},
		[]stated{deny("x/a", "x/b", tcp, 80), deny("z/a", "x/b", sctp, 81), allow("y/a", "z/b", sctp, 81)}},
	{"an empty ingress rule allows all", []*netv1.NetworkPolicy{denyIngressX,
		policy("x", "allow", netv1.NetworkPolicySpec{PodSelector: *all, Ingress: []netv1.NetworkPolicyIngressRule{{}}})},
		[]stated{allow("z/c", "x/a", udp, 81), allow("ext", "x/a", tcp, 80)}},
	{"an empty egress rule allows all", []*netv1.NetworkPolicy{denyEgressX,
		policy("x", "allow", netv1.NetworkPolicySpec{PodSelector: *all, PolicyTypes: egressOnly, Egress: []netv1.NetworkPolicyEgressRule{{}}})},
		[]stated{allow("x/a", "ext", tcp, 80), allow("x/b", "z/c", sctp, 80)}},
	{"a pod selector admits pods of the policy's namespace only", []*netv1.NetworkPolicy{xaFrom("p", podPeer(sel("pod", "b")))},
		[]stated{allow("x/b", "x/a", tcp, 80), deny("y/b", "x/a", tcp, 80), deny("x/c", "x/a", tcp, 80), allow("y/b", "x/b", tcp, 80)}},
	{"a namespace selector admits every pod of the namespaces", []*netv1.NetworkPolicy{xaFrom("p", nsPeer(sel("ns", "y")))},
		[]stated{allow("y/c", "x/a", tcp, 80), deny("x/b", "x/a", tcp, 80), deny("z/a", "x/a", udp, 80)}},
	{"namespace and pod selector in one peer are ANDed", []*netv1.NetworkPolicy{xaFrom("p", bothPeer(sel("ns", "y"), sel("pod", "b")))},
		[]stated{allow("y/b", "x/a", tcp, 80), deny("y/c", "x/a", tcp, 80), deny("x/b", "x/a", tcp, 80)}},
	{"two peers are ORed", []*netv1.NetworkPolicy{xaFrom("p", nsPeer(sel("ns", "y")), podPeer(sel("pod", "b")))},
		[]stated{allow("y/c", "x/a", tcp, 80), allow("x/b", "x/a", tcp, 80), deny("z/b", "x/a", tcp, 80)}},
	{"matchExpressions", []*netv1.NetworkPolicy{
		policy("x", "in", netv1.NetworkPolicySpec{PodSelector: *exprSel("pod", metav1.LabelSelectorOpIn, "a", "b"),
			Ingress: []netv1.NetworkPolicyIngressRule{ingress(peers(nsPeer(exprSel("ns", metav1.LabelSelectorOpNotIn, "x", "y"))))}}),
		policy("y", "exists", netv1.NetworkPolicySpec{PodSelector: *exprSel("pod", metav1.LabelSelectorOpExists),
			Ingress: []netv1.NetworkPolicyIngressRule{ingress(peers(bothPeer(all, exprSel("pod", metav1.LabelSelectorOpDoesNotExist))))}})},
		[]stated{allow("z/a", "x/a", tcp, 80), deny("y/a", "x/b", tcp, 80), allow("y/a", "x/c", tcp, 80), deny("x/a", "y/a", tcp, 80)}},
	{"ipBlock with except, ingress: node1's pods only", []*netv1.NetworkPolicy{xaFrom("p",
		blockPeer("10.244.0.0/16", "10.244.2.0/24"), blockPeer("fd00:10:244::/48", "fd00:10:244:2::/64"))},
		[]stated{allow("z/a", "x/a", tcp, 80), deny("y/a", "x/a", tcp, 80), deny("ext", "x/a", tcp, 80), allow("x/c", "x/a", sctp, 81)}},
	{"ipBlock with except, egress: judged on the pod's own address before masquerade", []*netv1.NetworkPolicy{
		policy("x", "p", netv1.NetworkPolicySpec{PodSelector: *sel("pod", "a"), PolicyTypes: egressOnly, Egress: []netv1.NetworkPolicyEgressRule{
			egress(peers(blockPeer("192.168.77.0/24", extIP+"/32"), blockPeer("10.244.2.0/24")))}})},
		[]stated{deny("x/a", "ext", tcp, 80), allow("x/a", "x/b", tcp, 80), deny("x/a", "x/c", tcp, 80), deny("x/a", "svc", tcp, 80)}},
	{"named ports resolve on each destination pod", []*netv1.NetworkPolicy{
		policy("x", "named", netv1.NetworkPolicySpec{PodSelector: *all,
			Ingress: []netv1.NetworkPolicyIngressRule{ingress(nil, namedPort(tcp, "serve-81-tcp"), namedPort(udp, "serve-80-udp"))}}),
		policy("z", "named", netv1.NetworkPolicySpec{PodSelector: *all,
			Ingress: []netv1.NetworkPolicyIngressRule{ingress(nil, namedPort(tcp, "serve-81-tcp"))}})},
		[]stated{allow("y/a", "x/a", tcp, 81), deny("y/a", "x/a", tcp, 80), allow("y/a", "x/a", udp, 80), allow("y/a", "z/c", tcp, 80), deny("y/a", "z/c", tcp, 81)}},
	{"named ports in egress, to pods, to an ipBlock and to any peer", []*netv1.NetworkPolicy{
		policy("x", "named", netv1.NetworkPolicySpec{PodSelector: *sel("pod", "a"), PolicyTypes: egressOnly, Egress: []netv1.NetworkPolicyEgressRule{
			egress(peers(nsPeer(sel("ns", "y"))), namedPort(tcp, "serve-81-tcp")),
			egress(peers(blockPeer("0.0.0.0/0")), namedPort(tcp, "serve-80-tcp")),
			egress(nil, namedPort(sctp, "serve-80-sctp"))}})},
		[]stated{allow("x/a", "y/b", tcp, 81), deny("x/a", "z/b", tcp, 81), deny("x/a", "ext", tcp, 80), allow("x/a", "z/c", sctp, 80), allow("x/a", "z/c", tcp, 81)}},
	{"endPort makes a range", []*netv1.NetworkPolicy{policy("x", "range", netv1.NetworkPolicySpec{PodSelector: *all,
		Ingress: []netv1.NetworkPolicyIngressRule{ingress(nil, portRange(tcp, 81, 90), portRange(udp, 70, 80))}})},
		[]stated{allow("y/a", "x/a", tcp, 81), deny("y/a", "x/a", tcp, 80), allow("y/a", "x/a", udp, 80), deny("y/a", "x/a", udp, 81)}},
	{"a UDP rule allows UDP only", []*netv1.NetworkPolicy{policy("x", "udp", netv1.NetworkPolicySpec{PodSelector: *all,
		Ingress: []netv1.NetworkPolicyIngressRule{ingress(peers(nsPeer(all)), port(udp, 80))}})},
		[]stated{allow("y/a", "x/a", udp, 80), deny("y/a", "x/a", tcp, 80), deny("y/a", "x/a", udp, 81)}},
	{"an SCTP rule allows SCTP only", []*netv1.NetworkPolicy{policy("x", "sctp", netv1.NetworkPolicySpec{PodSelector: *all,
		Ingress: []netv1.NetworkPolicyIngressRule{ingress(peers(nsPeer(all)), port(sctp, 81))}})},
		[]stated{allow("y/a", "x/a", sctp, 81), deny("y/a", "x/a", udp, 81), deny("y/a", "x/a", sctp, 80)}},
	{"a port without a number allows the whole protocol", []*netv1.NetworkPolicy{policy("x", "proto", netv1.NetworkPolicySpec{PodSelector: *all,
		Ingress: []netv1.NetworkPolicyIngressRule{ingress(nil, netv1.NetworkPolicyPort{Protocol: &udp})}})},
		[]stated{allow("y/a", "x/a", udp, 81), deny("y/a", "x/a", tcp, 81)}},
	{"policies are additive", []*netv1.NetworkPolicy{
		policy("x", "from-y", netv1.NetworkPolicySpec{PodSelector: *sel("pod", "a"), Ingress: []netv1.NetworkPolicyIngressRule{ingress(peers(nsPeer(sel("ns", "y"))), port(tcp, 80))}}),
		policy("x", "from-z", netv1.NetworkPolicySpec{PodSelector: *all, Ingress: []netv1.NetworkPolicyIngressRule{ingress(peers(nsPeer(sel("ns", "z"))), port(tcp, 81))}})},
		[]stated{allow("y/a", "x/a", tcp, 80), deny("y/a", "x/a", tcp, 81), allow("z/a", "x/a", tcp, 81), allow("z/a", "x/b", tcp, 81), deny("y/a", "x/b", tcp, 80)}},
	{"a Service's ClusterIP is judged on its backend", []*netv1.NetworkPolicy{xaFrom("p", podPeer(sel("pod", "b")))},
		[]stated{allow("x/b", "svc", tcp, 80), deny("y/a", "svc", tcp, 80), deny("y/b", "svc", tcp, 80)}},
}

// TestNetworkPolicyOnTwoNodes is the suite: one cluster, every case in
// turn, each checked on the whole truth table.
func TestNetworkPolicyOnTwoNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("needs kube-apiserver; skipped with -short")
	}
	start := time.Now()
	c := newTwoNodes(t)
	t.Logf("cluster up in %v: 2 nodes, %d pods, %d probes per check", time.Since(start).Round(time.Millisecond), len(c.pods), len(c.probes()))
	for _, tc := range matrixCases {
		t.Run(tc.name, func(t *testing.T) {
			c.t = t
			defer func() { c.t = c.root }()
			c.setPolicies(tc.policies...)
			c.check(t, tc.spots...)
		})
	}
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, c *twoNodes)
	}{
		{"label changes of pods and namespaces move them in and out of peers", labelChanges},
		{"a pod created after its policy is enforced and admitted", podAfterPolicy},
		{"a policy updated, then deleted", policyUpdatedAndDeleted},
		{"an open connection survives a policy that now denies it", establishedSurvives},
		{"a policy that does not compile keeps its previous version and is reported", invalidPolicy},
		{"denied connections are logged, counted and the node is healthy", observed},
		{"time from an API write to the kernel", latency},
		{"a restart keeps enforcing and keeps open connections", restart},
		{"nft flush ruleset is healed within the sync period", flushHealed},
		{"--network-policy=false enforces nothing and removes the table", disabled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c.t = t
			defer func() { c.t = c.root }()
			tc.run(t, c)
		})
	}
	t.Logf("suite took %v", time.Since(start).Round(time.Millisecond))
}

func labelChanges(t *testing.T, c *twoNodes) {
	c.setPolicies(xaFrom("p", bothPeer(sel("ns", "y"), sel("pod", "b"))))
	c.check(t, deny("y/c", "x/a", tcp, 80))
	yc := c.pods["y/c"].obj.DeepCopy()
	yc.Labels = map[string]string{"pod": "b"}
	c.pods["y/c"].obj = c.writePod(yc)
	c.check(t, allow("y/c", "x/a", tcp, 80))
	c.setNamespaceLabels("z", map[string]string{"ns": "y"})
	c.check(t, allow("z/b", "x/a", tcp, 80), deny("z/a", "x/a", tcp, 80))
	c.setNamespaceLabels("z", map[string]string{"ns": "z"})
	yc.Labels = map[string]string{"pod": "c"}
	c.pods["y/c"].obj = c.writePod(yc)
	c.check(t, deny("y/c", "x/a", tcp, 80), deny("z/b", "x/a", tcp, 80))
}

func podAfterPolicy(t *testing.T, c *twoNodes) {
	c.setPolicies(denyIngressX, policy("x", "from-d", netv1.NetworkPolicySpec{PodSelector: *all,
		Ingress: []netv1.NetworkPolicyIngressRule{ingress(peers(bothPeer(all, sel("pod", "d"))))}}))
	c.check(t)
	c.addPod("y/d", c.Nodes[1])
	c.addPod("x/d", c.Nodes[0])
	c.check(t, allow("y/d", "x/a", tcp, 80), deny("y/a", "x/d", tcp, 80), allow("x/d", "x/c", tcp, 81))
	c.deletePod("y/d")
	c.deletePod("x/d")
	c.check(t)
}

func policyUpdatedAndDeleted(t *testing.T, c *twoNodes) {
	np := policy("x", "p", netv1.NetworkPolicySpec{PodSelector: *sel("pod", "a"),
		Ingress: []netv1.NetworkPolicyIngressRule{ingress(peers(nsPeer(sel("ns", "y"))), port(tcp, 80))}})
	c.setPolicies(np)
	c.check(t, allow("y/a", "x/a", tcp, 80), deny("y/a", "x/a", tcp, 81))
	np = np.DeepCopy()
	np.Spec.Ingress[0].Ports = []netv1.NetworkPolicyPort{port(tcp, 81)}
	c.setPolicies(np)
	c.check(t, deny("y/a", "x/a", tcp, 80), allow("y/a", "x/a", tcp, 81))
	c.setPolicies()
	c.check(t, allow("y/a", "x/a", tcp, 80), allow("z/a", "x/a", tcp, 80))
}

// openConn opens a TCP connection between pods and sees it echo.
func (c *twoNodes) openConn(t *testing.T, from, to string, port int) net.Conn {
	t.Helper()
	var conn net.Conn
	addr := net.JoinHostPort(c.pods[to].IP, fmt.Sprint(port))
	if err := c.pods[from].NS.Do(func() (err error) { conn, err = net.DialTimeout("tcp4", addr, time.Second); return err }); err != nil {
		t.Fatalf("%s -> %s: %v", from, addr, err)
	}
	t.Cleanup(func() { conn.Close() })
	if !echoes(conn) {
		t.Fatalf("%s -> %s: no echo", from, addr)
	}
	return conn
}

func establishedSurvives(t *testing.T, c *twoNodes) {
	c.setPolicies()
	c.check(t)
	conns := []net.Conn{c.openConn(t, "y/a", "x/a", 80), c.openConn(t, "y/b", "x/b", 81)}
	c.setPolicies(denyIngressX, policy("y", "deny", netv1.NetworkPolicySpec{PodSelector: *all, PolicyTypes: egressOnly}))
	c.check(t, deny("y/a", "x/a", tcp, 80), deny("y/b", "x/b", tcp, 81))
	for i, conn := range conns {
		if !echoes(conn) {
			t.Errorf("open connection %d was cut by a policy that denies new ones", i)
		}
	}
}

func invalidPolicy(t *testing.T, c *twoNodes) {
	good := xaFrom("p", nsPeer(sel("ns", "y")))
	c.setPolicies(good)
	c.check(t, allow("y/a", "x/a", tcp, 80), deny("z/a", "x/a", tcp, 80))
	bad := xaFrom("p", blockPeer("010.0.0.0/8"))
	c.writePolicy(bad) // accepted by this API server, refused by Compile
	c.check(t, allow("y/a", "x/a", tcp, 80), deny("z/a", "x/a", tcp, 80))
	framework.Eventually(t, 10*time.Second, "an InvalidNetworkPolicy event on x/p from each node", func() error {
		evs, err := c.API.Client.CoreV1().Events("x").List(c.Ctx, metav1.ListOptions{FieldSelector: "reason=InvalidNetworkPolicy"})
		if err != nil {
			return err
		}
		var hosts []string
		for _, e := range evs.Items {
			if e.InvolvedObject.Kind == "NetworkPolicy" && e.InvolvedObject.Name == "p" &&
				strings.Contains(e.Message, "ipBlock.cidr") && strings.Contains(e.Message, "previous version stays in force") {
				hosts = append(hosts, e.Source.Host)
			}
		}
		if sort.Strings(hosts); strings.Join(hosts, ",") != "node1,node2" {
			return fmt.Errorf("events from %v", hosts)
		}
		return nil
	})
	for _, n := range c.Nodes {
		if log, _ := os.ReadFile(n.Proc.Log); !strings.Contains(string(log), `"NetworkPolicy not enforced"`) {
			t.Errorf("no log line on %s about the policy that does not compile", n.Name)
		}
	}
	c.setPolicies()
	c.check(t)
}

func observed(t *testing.T, c *twoNodes) {
	c.setPolicies(denyIngressX)
	c.check(t)
	n := c.Nodes[0] // x/a's
	framework.Eventually(t, 10*time.Second, "a log line for a denied connection to x/a", func() error {
		log, _ := os.ReadFile(n.Proc.Log)
		for _, line := range strings.Split(string(log), "\n") {
			if strings.Contains(line, `"denied connection"`) && strings.Contains(line, `pod="x/a"`) &&
				strings.Contains(line, `destination="`+c.pods["x/a"].IP+`:`) && strings.Contains(line, `direction="ingress"`) {
				t.Logf("%s logs: %s", n.Name, line)
				return nil
			}
		}
		return errors.New("none yet")
	})
	health, metrics := framework.ServedAddresses(t, n.Proc, 10*time.Second)
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{ // the servers listen in the node
		DialContext: func(_ context.Context, network, addr string) (net.Conn, error) { return n.NS.Dial(network, addr) }}}
	if code, body, err := framework.HTTPGet(client, "http://"+health+"/healthz"); err != nil || code != 200 {
		t.Errorf("/healthz: %d %v %s", code, err, body)
	}
	_, body, err := framework.HTTPGet(client, "http://"+metrics+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`netplane_node_sync_duration_seconds_count{feature="network-policy",type="full"}`, `netplane_node_sync_duration_seconds_count{feature="network-policy",type="partial"}`,
		"netplane_network_policy_policies 1", "netplane_network_policy_selected_pods 2", `netplane_network_policy_denied_packets_total{direction="ingress"}`} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(body, `netplane_network_policy_denied_packets_total{direction="ingress"} 0`+"\n") {
		t.Errorf("no denied ingress packet counted")
	}
}

// latency measures the time from an API write to the element it makes
// in the kernel of the node that enforces it, five times each.
func latency(t *testing.T, c *twoNodes) {
	c.setPolicies()
	c.check(t)
	n := c.Nodes[0]
	xa, yc := c.pods["x/a"], c.pods["y/c"]
	pods := c.API.Client.CoreV1().Pods("y")
	var created, relabelled, added []time.Duration
	var err error
	for i := range 5 {
		time.Sleep(300 * time.Millisecond) // past --min-sync-period's burst
		np := xaFrom("p", bothPeer(sel("ns", "y"), sel("pod", "b")))
		start := time.Now()
		if _, err := c.API.Client.NetworkingV1().NetworkPolicies("x").Create(c.Ctx, np, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		created = append(created, c.untilKernel(n, start, func(s kernelSets) bool { return s.has("ingress-pods", xa.IP) }))
		c.api.setPolicy(t, np)
		time.Sleep(300 * time.Millisecond)
		obj := yc.obj.DeepCopy()
		obj.Labels = map[string]string{"pod": "b"}
		start = time.Now()
		if yc.obj, err = pods.Update(c.Ctx, obj, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		relabelled = append(relabelled, c.untilKernel(n, start, func(s kernelSets) bool { return s.has("sel-", yc.IP) }))
		c.api.setPod(yc.obj)
		time.Sleep(300 * time.Millisecond)
		// A pod is a peer once the status write gives it its address, as
		// the kubelet's does: that write is timed.
		name := fmt.Sprintf("new%d", i)
		pod := modelPod("y", name)
		pod.Labels = map[string]string{"pod": "b"}
		pod.Spec.Containers = pod.Spec.Containers[:1]
		pod.Spec.Containers[0].Image = "registry.invalid/none"
		pod.Spec.NodeName = "node2"
		if pod, err = pods.Create(c.Ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		ip := fmt.Sprintf("10.244.2.%d", 200+i)
		pod.Status.Phase, pod.Status.PodIPs = v1.PodRunning, []v1.PodIP{{IP: ip}}
		start = time.Now()
		if _, err := pods.UpdateStatus(c.Ctx, pod, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		added = append(added, c.untilKernel(n, start, func(s kernelSets) bool { return s.has("sel-", ip) }))

		c.deletePolicy(types.NamespacedName{Namespace: "x", Name: "p"})
		obj = yc.obj.DeepCopy()
		obj.Labels = map[string]string{"pod": "c"}
		yc.obj = c.writePod(obj)
		if err := pods.Delete(c.Ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		c.untilKernel(n, time.Now(), func(s kernelSets) bool {
			return !s.has("ingress-pods", xa.IP) && !s.has("sel-", yc.IP) && !s.has("sel-", ip)
		})
	}
	for what, d := range map[string][]time.Duration{"policy created": created, "pod label changed": relabelled, "pod created": added} {
		slices.Sort(d)
		t.Logf("API write to the kernel of %s, %s: median %v, max %v (5 writes)", n.Name, what, d[2].Round(100*time.Microsecond), d[4].Round(100*time.Microsecond))
	}
	c.check(t)
}

// netipFrom is the address a set element's key is or begins with (an
// address, or an address . protocol . port).
func netipFrom(key []byte) (string, bool) {
	switch len(key) {
	case 4, 12:
		return netip.AddrFrom4([4]byte(key[:4])).String(), true
	case 16, 24:
		return netip.AddrFrom16([16]byte(key[:16])).String(), true
	}
	return "", false
}

// kernelSets are the elements of a node's sets, as their first address.
type kernelSets map[string][]string

// has says whether a set whose name starts with prefix holds addr.
func (k kernelSets) has(prefix, addr string) bool {
	for name, addrs := range k {
		if strings.HasPrefix(name, prefix) && slices.Contains(addrs, addr) {
			return true
		}
	}
	return false
}

// untilKernel polls n's table until cond holds and says how long after
// start it did.
func (c *twoNodes) untilKernel(n *tnode, start time.Time, cond func(kernelSets) bool) time.Duration {
	r := c.setReader(n)
	defer r.close()
	for time.Since(start) < 10*time.Second {
		if cond(r.read()) {
			return time.Since(start)
		}
		time.Sleep(time.Millisecond)
	}
	c.t.Fatalf("not in the kernel of %s after 10s", n.Name)
	return 0
}

// setReader reads the sets of a node's table over one netlink socket.
type setReader struct {
	t     *testing.T
	conn  *nftables.Conn
	close func()
}

func (c *twoNodes) setReader(n *tnode) *setReader {
	d, closeNS, err := nft.NamespaceDialer(n.NS.Path)
	if err != nil {
		c.t.Fatal(err)
	}
	conn, err := nftables.New(nftables.WithNetNSFd(d.NetNS), nftables.AsLasting())
	if err != nil {
		closeNS()
		c.t.Fatal(err)
	}
	return &setReader{t: c.t, conn: conn, close: func() { conn.CloseLasting(); closeNS() }}
}

// read is every set's elements, by their first address; none if the
// table is not there.
func (r *setReader) read() kernelSets {
	table := &nftables.Table{Family: nftables.TableFamilyINet, Name: TableName}
	k := kernelSets{}
	sets, err := r.conn.GetSets(table)
	if err != nil {
		return k
	}
	for _, s := range sets {
		elems, err := r.conn.GetSetElements(s)
		if err != nil {
			continue // gone meanwhile
		}
		for _, e := range elems {
			if a, ok := netipFrom(e.Key); ok {
				k[s.Name] = append(k[s.Name], a)
			}
		}
	}
	return k
}

func restart(t *testing.T, c *twoNodes) {
	c.setPolicies(denyIngressX, xaFrom("p", bothPeer(sel("ns", "y"), sel("pod", "b"))))
	c.check(t, allow("y/b", "x/a", tcp, 80), deny("y/a", "x/a", tcp, 80))
	n := c.Nodes[0] // x/a's
	conn := c.openConn(t, "y/b", "x/a", 80)
	denied := tprobe{"y/a", "x/a", false, tcp, 80}
	before := c.denied(n)
	c.restart(n, func() {
		if !slices.Contains(c.tables(n), "inet "+TableName) {
			t.Errorf("the table went with the agent: %v", c.tables(n))
		}
		if c.connect(denied) {
			t.Errorf("%s got through while the agent was down", denied)
		}
		if !echoes(conn) {
			t.Errorf("the open connection broke while the agent was down")
		}
	})
	// Through the start-up, until the new agent's first sync is done, x/a
	// is dispatched to its rules all the time, and the denied connection
	// does not get through.
	r := c.setReader(n)
	defer r.close()
	probe := make(chan bool, 1)
	go func() { probe <- c.connect(denied) }()
	xa := c.pods["x/a"].IP
	for deadline := time.Now().Add(30 * time.Second); !logged(n, `"synced"`, `type="full"`) && time.Now().Before(deadline); {
		if !r.read().has("ingress-pods", xa) {
			t.Errorf("x/a (%s) left the ingress dispatch while the agent started", xa)
			break
		}
		select {
		case through := <-probe:
			if through {
				t.Errorf("%s got through while the agent started", denied)
			}
			go func() { probe <- c.connect(denied) }()
		default:
		}
	}
	if <-probe {
		t.Errorf("%s got through while the agent started", denied)
	}
	if !echoes(conn) {
		t.Errorf("the open connection broke across the restart")
	}
	if after := c.denied(n); after[Ingress] < before[Ingress] {
		t.Errorf("the deny counter went from %d to %d: the table was rewritten, not adopted", before[Ingress], after[Ingress])
	}
	c.check(t, allow("y/b", "x/a", tcp, 80), deny("y/a", "x/a", tcp, 80))
}

// logged says whether a line of n's log has every part.
func logged(n *tnode, parts ...string) bool {
	log, _ := os.ReadFile(n.Proc.Log)
	for _, line := range strings.Split(string(log), "\n") {
		if strings.Contains(line, "network-policy") && !slices.ContainsFunc(parts, func(p string) bool { return !strings.Contains(line, p) }) {
			return true
		}
	}
	return false
}

func flushHealed(t *testing.T, c *twoNodes) {
	c.setPolicies(denyIngressX)
	c.check(t)
	n := c.Nodes[0]
	denied := tprobe{"y/a", "x/a", false, tcp, 80}
	n.NS.MustExec(t, "nft", "flush", "ruleset")
	start := time.Now()
	if !c.connect(denied) {
		t.Fatalf("%s did not get through with the table flushed", denied)
	}
	framework.EventuallyEvery(t, 20*time.Millisecond, syncPeriod+time.Second, "the table back after nft flush ruleset within --sync-period", func() error {
		if tables := c.tables(n); !slices.Contains(tables, "inet "+TableName) {
			return fmt.Errorf("tables %v", tables)
		}
		return nil
	})
	t.Logf("table back %v after nft flush ruleset (--sync-period=%v)", time.Since(start).Round(time.Millisecond), syncPeriod)
	c.check(t, deny("y/a", "x/a", tcp, 80))
}

func disabled(t *testing.T, c *twoNodes) {
	c.setPolicies(denyIngressX, policy("y", "deny", netv1.NetworkPolicySpec{PodSelector: *all, PolicyTypes: bothTypes}))
	c.check(t)
	n := c.Nodes[1]
	c.restart(n, nil, "--network-policy=false")
	c.disabled[n.Name] = true
	framework.Eventually(t, 20*time.Second, "the table removed from "+n.Name, func() error {
		if tables := c.tables(n); slices.Contains(tables, "inet "+TableName) {
			return fmt.Errorf("%v", tables)
		}
		return nil
	})
	c.check(t, allow("y/a", "x/b", tcp, 80), allow("z/a", "y/a", tcp, 80), deny("y/a", "x/a", tcp, 80), deny("y/b", "x/a", tcp, 80))
	c.restart(n, nil)
	delete(c.disabled, n.Name)
	c.check(t, deny("y/a", "x/b", tcp, 80), deny("z/a", "y/a", tcp, 80))
	c.setPolicies()
	c.check(t)
}
