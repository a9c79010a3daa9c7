package lab

import (
	"context"
	"fmt"
	"strings"

	"github.com/netplane/netplane/e2e/netns"
)

const underlayBridge = "underlay"

// buildTopology makes the underlay namespace with a bridge per subnet,
// each holding the subnet's gateway address (the hosts' default route, so
// that nothing ever leaves through the machine), then plugs every host
// into its subnet's bridge. With two subnets the underlay namespace
// forwards between them: a router with no route to any pod CIDR.
func (l *Lab) buildTopology(context.Context) error {
	var err error
	if l.Underlay, err = l.newNS("underlay"); err != nil {
		return err
	}
	for _, s := range subnets[:l.Config.Subnets] {
		if err := run(l.Underlay,
			[]string{"ip", "link", "add", s.bridge, "type", "bridge"},
			[]string{"ip", "link", "set", s.bridge, "up"},
			[]string{"ip", "addr", "add", s.gw4 + "/24", "dev", s.bridge},
			[]string{"ip", "addr", "add", s.gw6 + "/64", "dev", s.bridge, "nodad"},
		); err != nil {
			return err
		}
	}
	if l.Config.Subnets > 1 {
		if err := run(l.Underlay,
			[]string{"sysctl", "-qw", "net.ipv4.ip_forward=1"},
			[]string{"sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"},
		); err != nil {
			return err
		}
	}
	if l.ControlPlane, err = l.host("cp", subnets[0], ControlPlaneIP, ControlPlaneIP6); err != nil {
		return err
	}
	if l.Config.Subnets > 1 {
		if err := l.secondLeg(l.ControlPlane, "cp", subnets[1], ControlPlaneIPB, ControlPlaneIP6B); err != nil {
			return err
		}
	}
	if l.External, err = l.host("ext", subnets[0], ExternalIP, ExternalIP6); err != nil {
		return err
	}
	if l.Upstream, err = l.host("dns", subnets[0], UpstreamDNSIP, UpstreamDNSIP6); err != nil {
		return err
	}
	for i := 0; i < l.Config.Nodes; i++ {
		ip4, ip6 := l.Config.nodeAddrs(i)
		ns, err := l.host(fmt.Sprintf("node%d", i+1), l.Config.nodeSubnet(i), ip4, ip6)
		if err != nil {
			return err
		}
		// A node's OS forwards packets (kind's node image does the same);
		// what it forwards is netplane's business.
		if err := run(ns,
			[]string{"sysctl", "-qw", "net.ipv4.ip_forward=1"},
			[]string{"sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"},
		); err != nil {
			return err
		}
		l.Nodes = append(l.Nodes, &Node{Name: fmt.Sprintf("node-%d", i+1), Index: i, NS: ns, IP: ip4, IP6: ip6})
	}
	return nil
}

// newNS makes a namespace and records it before anything else happens.
func (l *Lab) newNS(label string) (*netns.NS, error) {
	ns, err := netns.Create("lab-" + label)
	if err != nil {
		return nil, err
	}
	l.state.addNamespace(ns.Name)
	return ns, nil
}

// host makes a namespace whose eth0 is a port of the subnet's bridge.
func (l *Lab) host(label string, s subnet, ip4, ip6 string) (*netns.NS, error) {
	ns, err := l.newNS(label)
	if err != nil {
		return nil, err
	}
	port := "p-" + label
	cmds := [][]string{
		{"ip", "link", "add", "eth0", "type", "veth", "peer", "name", port, "netns", l.Underlay.Path},
		{"ip", "link", "set", "eth0", "up"},
		{"ip", "addr", "add", ip4 + "/24", "dev", "eth0"},
		{"ip", "route", "add", "default", "via", s.gw4},
	}
	if ip6 != "" {
		cmds = append(cmds,
			[]string{"ip", "addr", "add", ip6 + "/64", "dev", "eth0", "nodad"},
			[]string{"ip", "-6", "route", "add", "default", "via", s.gw6})
	}
	if err := run(ns, cmds...); err != nil {
		return nil, err
	}
	return ns, run(l.Underlay,
		[]string{"ip", "link", "set", port, "master", s.bridge},
		[]string{"ip", "link", "set", port, "up"})
}

// secondLeg plugs a host into a second subnet as eth1, with no route but
// the subnet's own: every node is then on-link from it.
func (l *Lab) secondLeg(ns *netns.NS, label string, s subnet, ip4, ip6 string) error {
	port := "p-" + label + "-b"
	if err := run(ns,
		[]string{"ip", "link", "add", "eth1", "type", "veth", "peer", "name", port, "netns", l.Underlay.Path},
		[]string{"ip", "link", "set", "eth1", "up"},
		[]string{"ip", "addr", "add", ip4 + "/24", "dev", "eth1"},
		[]string{"ip", "addr", "add", ip6 + "/64", "dev", "eth1", "nodad"},
	); err != nil {
		return err
	}
	return run(l.Underlay,
		[]string{"ip", "link", "set", port, "master", s.bridge},
		[]string{"ip", "link", "set", port, "up"})
}

// routePodCIDRs routes each node's pod CIDRs from the control-plane host
// to the node's address, as a control plane without a node agent has them
// on a routed network: the API server then reaches pods for pods/proxy,
// services/proxy and webhooks. The control plane is on every subnet, so
// the underlay's router keeps knowing no pod CIDR.
func (l *Lab) routePodCIDRs(n *Node, cidrs []string) error {
	for _, c := range cidrs {
		if _, err := l.ControlPlane.Exec("ip", "route", "replace", c, "via", n.addrFor(c)); err != nil {
			return err
		}
	}
	return nil
}

// addrFor is the node's underlay address of cidr's family: where a route
// to it goes.
func (n *Node) addrFor(cidr string) string {
	if strings.Contains(cidr, ":") {
		return n.IP6
	}
	return n.IP
}

// RouteToNode routes addr (a /32 or /128) from the external client to a
// node over the underlay, as the router in front of a cluster does for an
// externalIP or a load balancer's address. A node on the other subnet is
// reached through the underlay namespace, which routes addr on to it.
func (l *Lab) RouteToNode(addr string, n *Node) error {
	host, gw, via := addr+"/32", UnderlayGateway4, n.IP
	if strings.Contains(addr, ":") {
		host, gw, via = addr+"/128", UnderlayGateway6, n.IP6
	}
	if l.Config.nodeSubnet(n.Index) == subnets[0] {
		_, err := l.External.Exec("ip", "route", "replace", host, "via", via)
		return err
	}
	if _, err := l.External.Exec("ip", "route", "replace", host, "via", gw); err != nil {
		return err
	}
	_, err := l.Underlay.Exec("ip", "route", "replace", host, "via", via)
	return err
}

// run runs commands inside ns, stopping at the first failure.
func run(ns *netns.NS, cmds ...[]string) error {
	for _, c := range cmds {
		if _, err := ns.Exec(c[0], c[1:]...); err != nil {
			return err
		}
	}
	return nil
}
