package lab

import (
	"context"
	"fmt"

	"github.com/netplane/netplane/e2e/netns"
)

const underlayBridge = "underlay"

// buildTopology makes the underlay namespace with its bridge (which also
// holds the underlay's gateway address, the hosts' default route, so that
// nothing ever leaves through the machine), then plugs every host into it.
func (l *Lab) buildTopology(context.Context) error {
	var err error
	if l.Underlay, err = l.newNS("underlay"); err != nil {
		return err
	}
	if err := run(l.Underlay,
		[]string{"ip", "link", "add", underlayBridge, "type", "bridge"},
		[]string{"ip", "link", "set", underlayBridge, "up"},
		[]string{"ip", "addr", "add", UnderlayGateway4 + "/24", "dev", underlayBridge},
		[]string{"ip", "addr", "add", UnderlayGateway6 + "/64", "dev", underlayBridge, "nodad"},
	); err != nil {
		return err
	}
	if l.ControlPlane, err = l.host("cp", ControlPlaneIP, ControlPlaneIP6); err != nil {
		return err
	}
	if l.External, err = l.host("ext", ExternalIP, ExternalIP6); err != nil {
		return err
	}
	if l.Upstream, err = l.host("dns", UpstreamDNSIP, ""); err != nil {
		return err
	}
	for i := 0; i < l.Config.Nodes; i++ {
		ns, err := l.host(fmt.Sprintf("node%d", i+1), NodeIP(i), NodeIP6(i))
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
		l.Nodes = append(l.Nodes, &Node{Name: fmt.Sprintf("node-%d", i+1), Index: i, NS: ns, IP: NodeIP(i), IP6: NodeIP6(i)})
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

// host makes a namespace whose eth0 is a port of the underlay bridge.
func (l *Lab) host(label, ip4, ip6 string) (*netns.NS, error) {
	ns, err := l.newNS(label)
	if err != nil {
		return nil, err
	}
	port := "p-" + label
	cmds := [][]string{
		{"ip", "link", "add", "eth0", "type", "veth", "peer", "name", port, "netns", l.Underlay.Path},
		{"ip", "link", "set", "eth0", "up"},
		{"ip", "addr", "add", ip4 + "/24", "dev", "eth0"},
		{"ip", "route", "add", "default", "via", UnderlayGateway4},
	}
	if ip6 != "" {
		cmds = append(cmds,
			[]string{"ip", "addr", "add", ip6 + "/64", "dev", "eth0", "nodad"},
			[]string{"ip", "-6", "route", "add", "default", "via", UnderlayGateway6})
	}
	if err := run(ns, cmds...); err != nil {
		return nil, err
	}
	return ns, run(l.Underlay,
		[]string{"ip", "link", "set", port, "master", underlayBridge},
		[]string{"ip", "link", "set", port, "up"})
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
