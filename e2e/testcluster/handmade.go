package testcluster

import (
	"net/netip"
	"strconv"
	"testing"
)

// HandPod is a pod the test wires to a node itself, as a CNI plugin would:
// for the tests of one node feature, where no agent (or no agent's pod
// network) makes pods.
type HandPod struct {
	Label string // of its namespace; its link on the node is "v"+Label
	// IPs are its addresses with their prefix ("10.244.1.2/24"). The first
	// address of each prefix is the pod's gateway, its default route.
	IPs []string
	// Bridge is the node's bridge the pod joins, made with the gateways on
	// first use. "" routes the pod instead: it has host addresses, the
	// gateway is a host address on the node's end of its link, and the node
	// a host route to it, so every packet, also between two pods of the
	// node, goes through the node.
	Bridge string
	MTU    int // of both ends of its link; 0 leaves the default
}

// AddHandPod makes pod p on n. The node forwards both families, as an
// agent makes it.
func (c *Cluster) AddHandPod(t testing.TB, n *Node, p HandPod) *Pod {
	t.Helper()
	link := "v" + p.Label
	pod := &Pod{ID: p.Label, Node: n, Link: link, NS: c.host(t, p.Label, n.NS, link, "eth0")}
	n.NS.Sysctl(t, "net.ipv4.ip_forward", "1")
	n.NS.Sysctl(t, "net.ipv6.conf.all.forwarding", "1")
	if p.MTU != 0 {
		n.NS.MustExec(t, "ip", "link", "set", link, "mtu", strconv.Itoa(p.MTU))
		pod.NS.MustExec(t, "ip", "link", "set", "eth0", "mtu", strconv.Itoa(p.MTU))
	}
	if p.Bridge != "" {
		c.handBridge(t, n, p)
		n.NS.Attach(t, link, p.Bridge)
	}
	for _, ip := range p.IPs {
		prefix := netip.MustParsePrefix(ip)
		addr, gw := prefix.Addr(), prefix.Masked().Addr().Next()
		if addr.Is4() {
			pod.IP = addr.String()
		} else {
			pod.IP6 = addr.String()
		}
		if p.Bridge != "" {
			pod.NS.Addr(t, "eth0", ip)
			pod.NS.Route(t, "default", "via", gw.String())
			continue
		}
		host := netip.PrefixFrom(addr, addr.BitLen()).String()
		pod.NS.Addr(t, "eth0", host)
		n.NS.Addr(t, link, netip.PrefixFrom(gw, gw.BitLen()).String())
		n.NS.Route(t, host, "dev", link)
		pod.NS.Route(t, "default", "via", gw.String(), "dev", "eth0", "onlink")
	}
	return pod
}

// handBridge makes p's bridge on n with p's gateways, unless it exists.
func (c *Cluster) handBridge(t testing.TB, n *Node, p HandPod) {
	if n.bridges[p.Bridge] {
		return
	}
	if n.bridges == nil {
		n.bridges = map[string]bool{}
	}
	n.bridges[p.Bridge] = true
	n.NS.Bridge(t, p.Bridge)
	for _, ip := range p.IPs {
		prefix := netip.MustParsePrefix(ip)
		n.NS.Addr(t, p.Bridge, netip.PrefixFrom(prefix.Masked().Addr().Next(), prefix.Bits()).String())
	}
}
