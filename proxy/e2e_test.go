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
)

// The lab: node-a (192.168.0.2, fd00:192::2; zone z1) runs `netplane
// --role=node`; pods a1, a2 on it (10.244.1.0/24, routed veths); node-b
// (192.168.0.3) with pod b1 (10.244.2.2) is "another node"; ext
// (203.0.113.2, 2001:db8:113::2) is an external client. The cluster CIDRs
// are 10.244.1.0/24 and 10.244.2.0/24 (two of one family) and fd00:244::/32;
// the Service CIDRs 10.96.0.0/16 and fd00:10:96::/112. Every pod runs TCP
// and UDP echo servers that answer "<pod> <client address seen>", and an
// SCTP probe listener (flows_sctp_test.go).

type lab struct {
	t     *testing.T
	api   *framework.APIServer
	node  *netns.NS
	nodeB *netns.NS
	pods  map[string]*netns.NS
	ext   *netns.NS
	proc  *framework.Process
	args  []string
	ctx   context.Context
	sctp  *sctpLab
}

// netplaneBinary is bin/netplane under `make test`, or cmd/netplane built
// from this tree for this test process (see framework.NetplaneBinaries).
func netplaneBinary(t testing.TB) string {
	return filepath.Join(framework.NetplaneBinaries(t), "netplane")
}

func TestMain(m *testing.M) { framework.Main(m) }

func newLab(t *testing.T) *lab {
	if testing.Short() {
		t.Skip("end-to-end")
	}
	framework.RequireRoot(t)
	bin := netplaneBinary(t)
	// The lab's API calls share one context, bounded so a hung call fails but
	// long enough for the whole flow table on a loaded machine (framework.Ctx
	// gives 60 s, which a slow run of the table outlasts).
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	t.Cleanup(cancel)
	l := &lab{t: t, api: framework.StartAPIServer(t, framework.Options{}), pods: map[string]*netns.NS{}, ctx: ctx, sctp: newSCTPLab()}
	l.node = l.host("node-a")
	l.node.Sysctl(t, "net.ipv4.ip_forward", "1")
	l.node.Sysctl(t, "net.ipv6.conf.all.forwarding", "1")
	nodeB := l.host("node-b")
	l.nodeB = nodeB
	nodeB.Sysctl(t, "net.ipv4.ip_forward", "1")
	nodeB.Sysctl(t, "net.ipv6.conf.all.forwarding", "1")
	netns.Veth(t, l.node, "underlay", nodeB, "underlay")
	l.node.Addr(t, "underlay", "192.168.0.2/24")
	l.node.Addr(t, "underlay", "fd00:192::2/64")
	nodeB.Addr(t, "underlay", "192.168.0.3/24")
	nodeB.Addr(t, "underlay", "fd00:192::3/64")
	l.node.Route(t, "10.244.2.0/24", "via", "192.168.0.3")
	l.node.Route(t, "fd00:244:2::/64", "via", "fd00:192::3")
	nodeB.Route(t, "default", "via", "192.168.0.2")
	nodeB.Route(t, "default", "via", "fd00:192::2")
	l.pod(l.node, "a1", "10.244.1.2", "fd00:244:1::2")
	l.pod(l.node, "a2", "10.244.1.3", "fd00:244:1::3")
	l.pod(nodeB, "b1", "10.244.2.2", "fd00:244:2::2")
	l.ext = l.host("ext")
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
	// is full): a packet to it that left node-a would be refused there, not
	// silently lost.
	l.ext.Addr(t, "lo", unallocatedClusterIP4+"/32")
	nodeB.Addr(t, "lo", unallocatedClusterIP6+"/128")
	l.createNode()
	l.start(bin)
	return l
}

func (l *lab) host(label string) *netns.NS {
	ns := netns.New(l.t, label)
	l.quiet(ns)
	return ns
}

// quiet turns off what would make counting rejects or using IPv6 at once flaky.
func (l *lab) quiet(ns *netns.NS) {
	ns.Sysctl(l.t, "net.ipv4.icmp_ratelimit", "0")
	ns.Sysctl(l.t, "net.ipv6.icmp.ratelimit", "0")
	ns.Sysctl(l.t, "net.ipv6.conf.default.accept_dad", "0")
	ns.Sysctl(l.t, "net.ipv6.conf.all.accept_dad", "0")
}

// pod makes a pod namespace routed from node (no bridge: a /32 route per
// pod), with echo servers (netns.ServeEcho, TCP and UDP) on ports 8080 and
// 5353.
func (l *lab) pod(node *netns.NS, name, ip4, ip6 string) {
	t := l.t
	p := l.host(name)
	netns.Veth(t, node, "v"+name, p, "eth0")
	gw4 := ip4[:strings.LastIndex(ip4, ".")] + ".1"
	gw6 := ip6[:strings.LastIndex(ip6, ":")] + ":1"
	// Host addresses: every packet, also to a pod on the same node, goes
	// through the node, as with a routed CNI.
	p.Addr(t, "eth0", ip4+"/32")
	p.Addr(t, "eth0", ip6+"/128")
	node.Addr(t, "v"+name, gw4+"/32")
	node.Addr(t, "v"+name, gw6+"/128")
	node.Route(t, ip4+"/32", "dev", "v"+name)
	node.Route(t, ip6+"/128", "dev", "v"+name)
	p.Route(t, "default", "via", gw4, "dev", "eth0", "onlink")
	p.Route(t, "default", "via", gw6, "dev", "eth0", "onlink")
	p.ServeEcho(t, ":8080", name)
	p.ServeEcho(t, ":5353", name)
	l.sctp.listen(t, p, name, ip4, ip6)
	l.pods[name] = p
}

func (l *lab) createNode() {
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{v1.LabelTopologyZone: "z1"}}}
	n, err := l.api.Client.CoreV1().Nodes().Create(l.ctx, n, metav1.CreateOptions{})
	if err != nil {
		l.t.Fatal(err)
	}
	n.Status.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "192.168.0.2"}, {Type: v1.NodeInternalIP, Address: "fd00:192::2"}}
	if _, err := l.api.Client.CoreV1().Nodes().UpdateStatus(l.ctx, n, metav1.UpdateOptions{}); err != nil {
		l.t.Fatal(err)
	}
}

func (l *lab) start(bin string) {
	t := l.t
	if l.args == nil {
		fwd := l.node.Forward(t, "127.0.0.1:0", strings.TrimPrefix(l.api.URL, "https://"))
		kc := filepath.Join(t.TempDir(), "kubeconfig")
		if err := l.api.WriteKubeconfig(kc, "https://"+fwd, l.api.Token); err != nil {
			t.Fatal(err)
		}
		tmp := t.TempDir()
		l.args = []string{"--role=node", "--kubeconfig=" + kc, "--node-name=node-a",
			"--cluster-cidr=10.244.1.0/24,10.244.2.0/24,fd00:244::/32", "--service-cidrs=10.96.0.0/16,fd00:10:96::/112",
			"--sync-period=3s", "--min-sync-period=0s",
			"--health-bind-address=127.0.0.1:10290", "--metrics-bind-address=127.0.0.1:10291",
			"--cni-conf-dir=" + tmp, "--cni-bin-dir=" + tmp, "--ipam-state-dir=" + tmp, "--bridge=np-e2e0", "-v=2"}
	}
	l.proc = l.node.Start(t, bin, l.args...)
}

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
	s, err := l.api.Client.CoreV1().Services("default").Create(l.ctx, s, metav1.CreateOptions{})
	if err != nil {
		l.t.Fatal(err)
	}
	if len(ingress) > 0 {
		s.Status.LoadBalancer.Ingress = ingress
		if s, err = l.api.Client.CoreV1().Services("default").UpdateStatus(l.ctx, s, metav1.UpdateOptions{}); err != nil {
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
			node := "node-a"
			if strings.HasPrefix(e.pod, "b") {
				node = "node-b"
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
		c := l.api.Client.DiscoveryV1().EndpointSlices("default")
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
		from, network, addr, want, seenAs, got, last, l.proc.Tail(20))
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
