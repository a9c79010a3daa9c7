package proxy

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
	"github.com/netplane/netplane/e2e/testcluster"
)

// The lab is a testcluster: node1 (192.168.0.2, fd00:192::2; zone z1)
// runs `netplane --role=node`; pods a1, a2 on it (10.244.1.0/24, routed
// veths); node2 (192.168.0.3), running no agent, with pod b1 (10.244.2.2)
// is "another node"; ext (203.0.113.2, 2001:db8:113::2), linked to node1,
// is an external client. The cluster CIDRs are 10.244.1.0/24 and
// 10.244.2.0/24 (two of one family) and fd00:244::/32; the Service CIDRs
// 10.96.0.0/16 and fd00:10:96::/112. The Nodes have no pod CIDR, so the
// agent's pod network waits and the pods are wired by hand. Every pod runs
// TCP and UDP echo servers that answer "<pod> <client address seen>", and
// an SCTP probe listener (flows_sctp_test.go).

type lab struct {
	t     *testing.T
	c     *testcluster.Cluster
	agent *testcluster.Node // node1
	node  *netns.NS         // node1's namespace
	nodeB *netns.NS
	pods  map[string]*netns.NS
	ext   *netns.NS
	flags []string // the agent's, beyond testcluster's
	ctx   context.Context
	sctp  *sctpLab
}

// The lab's nodes.
const (
	nodeA = "node1"
	nodeB = "node2"
)

func TestMain(m *testing.M) { framework.Main(m) }

// netplaneBinary is bin/netplane under `make test`, or cmd/netplane built
// from this tree for this test process (see framework.NetplaneBinaries).
func netplaneBinary(t testing.TB) string {
	return filepath.Join(framework.NetplaneBinaries(t), "netplane")
}

func newLab(t *testing.T) *lab {
	if testing.Short() {
		t.Skip("end-to-end")
	}
	// The lab's API calls share the cluster's context, bounded so a hung
	// call fails but long enough for the whole flow table on a loaded
	// machine (framework.Ctx gives 60 s, which a slow run of the table
	// outlasts).
	c := testcluster.New(t, testcluster.Options{
		Subnets:      []testcluster.Subnet{{V4: "192.168.0.", V6: "fd00:192::"}},
		Place:        func(i int) (int, string) { return 0, fmt.Sprint(1 + i) },
		NoDAD:        true,
		ClusterCIDRs: []string{"10.244.1.0/24", "10.244.2.0/24", "fd00:244::/32"},
		NoPodCIDRs:   true,
		NoStart:      true,
		Timeout:      10 * time.Minute,
		Setup:        func(t testing.TB, n *testcluster.Node) { quiet(t, n.NS) },
	})
	l := &lab{t: t, c: c, agent: c.Nodes[0], node: c.Nodes[0].NS, nodeB: c.Nodes[1].NS, pods: map[string]*netns.NS{},
		ctx: c.Ctx, sctp: newSCTPLab()}
	l.node.Route(t, "10.244.2.0/24", "via", "192.168.0.3")
	l.node.Route(t, "fd00:244:2::/64", "via", "fd00:192::3")
	l.nodeB.Route(t, "default", "via", "192.168.0.2")
	l.nodeB.Route(t, "default", "via", "fd00:192::2")
	l.pod(c.Nodes[0], "a1", "10.244.1.2", "fd00:244:1::2")
	l.pod(c.Nodes[0], "a2", "10.244.1.3", "fd00:244:1::3")
	l.pod(c.Nodes[1], "b1", "10.244.2.2", "fd00:244:2::2")
	l.ext = netns.NewNoDAD(t, "ext")
	quiet(t, l.ext)
	netns.Veth(t, l.node, "toext", l.ext, "eth0")
	l.node.Addr(t, "toext", "203.0.113.1/24")
	l.ext.Addr(t, "eth0", "203.0.113.2/24")
	l.node.Addr(t, "toext", "2001:db8:113::1/64")
	l.ext.Addr(t, "eth0", "2001:db8:113::2/64")
	l.ext.Route(t, "default", "via", "203.0.113.1")
	l.ext.Route(t, "default", "via", "2001:db8:113::1")
	// Real nodes have a default route; without one the node's own
	// connections to a ClusterIP fail before DNAT.
	l.node.Route(t, "default", "via", "203.0.113.2")
	l.node.Route(t, "default", "via", "fd00:192::3")
	// The next hops of those default routes own an address in the Service
	// CIDRs that no Service has (the API server allocates from the low 256
	// addresses of a range, kept for static ClusterIPs, only when the rest
	// is full): a packet to it that left node1 would be refused there, not
	// silently lost.
	l.ext.Addr(t, "lo", unallocatedClusterIP4+"/32")
	l.nodeB.Addr(t, "lo", unallocatedClusterIP6+"/128")
	l.zone()
	l.flags = []string{"--service-cidrs=10.96.0.0/16,fd00:10:96::/112", "--sync-period=3s", "--min-sync-period=0s",
		"--bridge=np-e2e0", "-v=2"}
	l.start()
	return l
}

// quiet turns off what would make counting rejects flaky.
func quiet(t testing.TB, ns *netns.NS) {
	ns.Sysctl(t, "net.ipv4.icmp_ratelimit", "0")
	ns.Sysctl(t, "net.ipv6.icmp.ratelimit", "0")
}

// pod makes a pod on node routed from it (no bridge: a /32 route per pod,
// so every packet, also to a pod on the same node, goes through the node,
// as with a routed CNI), with echo servers (netns.ServeEcho, TCP and UDP)
// on ports 8080 and 5353.
func (l *lab) pod(node *testcluster.Node, name, ip4, ip6 string) {
	t := l.t
	p := l.c.AddHandPod(t, node, testcluster.HandPod{Label: name, IPs: []string{ip4 + "/24", ip6 + "/64"}}).NS
	quiet(t, p)
	p.ServeEcho(t, ":8080", name)
	p.ServeEcho(t, ":5353", name)
	l.sctp.listen(t, p, name, ip4, ip6)
	l.pods[name] = p
}

// zone puts node1 in zone z1.
func (l *lab) zone() {
	nodes := l.c.API.Client.CoreV1().Nodes()
	n, err := nodes.Get(l.ctx, nodeA, metav1.GetOptions{})
	if err != nil {
		l.t.Fatal(err)
	}
	n.Labels = map[string]string{v1.LabelTopologyZone: "z1"}
	if _, err := nodes.Update(l.ctx, n, metav1.UpdateOptions{}); err != nil {
		l.t.Fatal(err)
	}
}

// start starts the agent on node1 with the lab's flags and waits until it
// serves its metrics.
func (l *lab) start() {
	l.c.Start(l.t, l.agent, l.flags...)
	l.agent.Served(l.t)
}

// metrics is the agent's /metrics.
func (l *lab) metrics() (int, string) { return httpGet(l.node, "http://"+l.agent.Metrics+"/metrics") }

// hit is hit, or an SCTP probe for network "sctp".
func (l *lab) hit(ns *netns.NS, network, addr string) string {
	if network == "sctp" {
		return l.sctp.probe(ns, addr)
	}
	return hit(ns, network, addr)
}

// hit connects from ns to addr and returns "<pod> <seen client>", "refused",
// or "timeout".
func hit(ns *netns.NS, network, addr string) string {
	timeout := time.Second
	if strings.HasPrefix(addr, "[") {
		// Measured here (kernel 6.18): a TCP connect to a rejected IPv6
		// address fails only when the SYN is retransmitted, after 1 s,
		// though the first ICMPv6 port unreachable reaches the client (its
		// counters show it); IPv4 fails at once. Why is not established.
		timeout = 2 * time.Second
	}
	reply, err := ns.Ask(network, addr, timeout)
	switch {
	case err == nil:
		return reply
	case strings.Contains(err.Error(), "refused"):
		return "refused"
	case strings.Contains(err.Error(), "timeout"):
		return "timeout"
	}
	return err.Error()
}

// Unallocated addresses of the lab's Service CIDRs (see newLab).
const (
	unallocatedClusterIP4 = "10.96.0.200"
	unallocatedClusterIP6 = "fd00:10:96::c8"
)

type svcOpt func(*v1.Service)

// service creates a dual-stack Service "name" with TCP 80 → 8080 and UDP 53
// → 5353 (opts may change the ports: the slices also offer SCTP "sctp" on
// 9999), and one EndpointSlice per family with the given pods.
func (l *lab) service(name string, eps []labEP, opts ...svcOpt) *v1.Service {
	s := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}, Spec: v1.ServiceSpec{
		IPFamilyPolicy: ptr.To(v1.IPFamilyPolicyPreferDualStack),
		Ports: []v1.ServicePort{
			{Name: "http", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)},
			{Name: "dns", Protocol: v1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(5353)},
		}}}
	for _, o := range opts {
		o(s)
	}
	ingress := s.Status.LoadBalancer.Ingress // a load-balancer controller's part
	s, err := l.c.API.Client.CoreV1().Services("default").Create(l.ctx, s, metav1.CreateOptions{})
	if err != nil {
		l.t.Fatal(err)
	}
	if len(ingress) > 0 {
		s.Status.LoadBalancer.Ingress = ingress
		if s, err = l.c.API.Client.CoreV1().Services("default").UpdateStatus(l.ctx, s, metav1.UpdateOptions{}); err != nil {
			l.t.Fatal(err)
		}
	}
	l.endpoints(name, eps)
	return s
}

type labEP struct {
	pod         string
	terminating bool
	zones       []string // topology hints
	nodes       []string
}

var podIPs = map[string][2]string{
	"a1": {"10.244.1.2", "fd00:244:1::2"}, "a2": {"10.244.1.3", "fd00:244:1::3"}, "b1": {"10.244.2.2", "fd00:244:2::2"},
}

// endpoints writes (creates or replaces) the Service's two slices.
func (l *lab) endpoints(name string, eps []labEP) {
	for fam, at := range []discovery.AddressType{discovery.AddressTypeIPv4, discovery.AddressTypeIPv6} {
		s := &discovery.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: name + "-" + strings.ToLower(string(at)), Labels: map[string]string{discovery.LabelServiceName: name}},
			AddressType: at,
			Ports: []discovery.EndpointPort{
				{Name: ptr.To("http"), Protocol: ptr.To(v1.ProtocolTCP), Port: ptr.To[int32](8080)},
				{Name: ptr.To("dns"), Protocol: ptr.To(v1.ProtocolUDP), Port: ptr.To[int32](5353)},
				{Name: ptr.To("sctp"), Protocol: ptr.To(v1.ProtocolSCTP), Port: ptr.To[int32](sctpPort)},
			},
		}
		for _, e := range eps {
			node := nodeA
			if strings.HasPrefix(e.pod, "b") {
				node = nodeB
			}
			de := discovery.Endpoint{
				Addresses: []string{podIPs[e.pod][fam]}, NodeName: ptr.To(node),
				Conditions: discovery.EndpointConditions{Ready: ptr.To(!e.terminating), Serving: ptr.To(true), Terminating: ptr.To(e.terminating)},
			}
			if len(e.zones)+len(e.nodes) > 0 {
				de.Hints = &discovery.EndpointHints{}
				for _, z := range e.zones {
					de.Hints.ForZones = append(de.Hints.ForZones, discovery.ForZone{Name: z})
				}
				for _, n := range e.nodes {
					de.Hints.ForNodes = append(de.Hints.ForNodes, discovery.ForNode{Name: n})
				}
			}
			s.Endpoints = append(s.Endpoints, de)
		}
		c := l.c.API.Client.DiscoveryV1().EndpointSlices("default")
		_ = c.Delete(l.ctx, s.Name, metav1.DeleteOptions{})
		if _, err := c.Create(l.ctx, s, metav1.CreateOptions{}); err != nil {
			l.t.Fatal(err)
		}
	}
}

// expect polls until hitting addr from ns gives one of want (pod names, or
// "refused"/"timeout"), with the client seen as seenAs ("" to ignore; "masq"
// for anything but the client's own address), and every wanted pod has
// answered at least once.
func (l *lab) expect(from string, network, addr string, seenAs string, want ...string) {
	l.t.Helper()
	ns := l.ns(from)
	got := map[string]bool{}
	var last string
	// Right answers are taken as fast as they come; a wrong one starts the
	// count again after the interval.
	err := wait.PollUntilContextTimeout(l.ctx, 100*time.Millisecond, 15*time.Second, true, func(ctx context.Context) (bool, error) {
		for ctx.Err() == nil {
			last = l.hit(ns, network, addr)
			pod, seen, _ := strings.Cut(last, " ")
			if !contains(want, pod) {
				got = map[string]bool{}
				return false, nil
			}
			if seenAs != "" && seen != "" && !seenOK(seenAs, seen, l.clientIP(from, addr)) {
				l.t.Fatalf("%s → %s %s answered by %s, which saw the client as %s; want %s", from, network, addr, pod, seen, seenAs)
			}
			got[pod] = true
			if len(got) == len(want) {
				return true, nil
			}
		}
		return false, nil
	})
	if err == nil {
		l.confirm(ns, network, addr, seenAs, from, want)
		return
	}
	l.t.Fatalf("%s → %s %s: want answers from all of %v (client seen as %q); got %v, last %q\nnetplane log:\n%s",
		from, network, addr, want, seenAs, got, last, l.agent.Proc.Tail(20))
}

// confirm checks, once every wanted answer came, that a few more go to
// the wanted pods only: a wrong endpoint that is merely one of several
// choices would otherwise go unnoticed. Drops and rejects are not
// repeated (a drop costs a timeout, an IPv6 reject a second).
func (l *lab) confirm(ns *netns.NS, network, addr, seenAs, from string, want []string) {
	l.t.Helper()
	if contains(want, "timeout") || contains(want, "refused") {
		return
	}
	for i := 0; i < 6; i++ {
		r := l.hit(ns, network, addr)
		pod, seen, _ := strings.Cut(r, " ")
		if !contains(want, pod) || seenAs != "" && seen != "" && !seenOK(seenAs, seen, l.clientIP(from, addr)) {
			l.t.Fatalf("%s → %s %s: after answers from all of %v came %q (client seen as %q wanted)", from, network, addr, want, r, seenAs)
		}
	}
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

func seenOK(want, seen, client string) bool {
	if want == "masq" {
		return seen != client
	}
	return seen == want
}

func (l *lab) ns(name string) *netns.NS {
	switch name {
	case "ext":
		return l.ext
	case "node":
		return l.node
	case "node-b":
		return l.nodeB
	}
	return l.pods[name]
}

func (l *lab) clientIP(from, addr string) string {
	v6 := strings.HasPrefix(addr, "[")
	switch {
	case from == "node" && !v6: // the source of its default route; masquerade picks another
		return "203.0.113.1"
	case from == "ext" && v6:
		return "2001:db8:113::2"
	case from == "ext":
		return "203.0.113.2"
	case v6:
		return podIPs[from][1]
	}
	return podIPs[from][0]
}

func hp(ip string, port int32) string { return net.JoinHostPort(ip, fmt.Sprint(port)) }
