package explain

import (
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/netplane/netplane/nodeview"
	"github.com/netplane/netplane/wireguard"
)

// tunnelKernel has WireGuard's table and nothing else: checkTunnel reads
// no more of a Kernel.
type tunnelKernel struct {
	Kernel
	routes []netlink.Route
}

func (k tunnelKernel) TunnelRoutes() ([]netlink.Route, error) { return k.routes, nil }

func (k tunnelKernel) LinkName(index int) string {
	if index == 7 {
		return wireguard.DeviceName
	}
	return "eth0"
}

func TestCheckTunnel(t *testing.T) {
	route := func(cidr string, link int) netlink.Route {
		_, dst, _ := net.ParseCIDR(cidr)
		return netlink.Route{Dst: dst, LinkIndex: link, Table: wireguard.RouteTable}
	}
	nodes := []nodeview.Node{{Name: "n2", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.2.0/24"), netip.MustParsePrefix("fd00:10:244:2::/64")}}}
	for _, c := range []struct {
		name   string
		ip     string
		routes []netlink.Route
		differ string // "" when the kernel agrees
	}{
		{"the peer's pod CIDR into the device", "10.244.2.5", []netlink.Route{route("10.244.2.0/24", 7)}, ""},
		{"the route missing", "10.244.2.5", nil, "route 10.244.2.0/24 dev netplane.wg in table 208 (to node n2) is missing"},
		{"the route on another device", "10.244.2.5", []netlink.Route{route("10.244.2.0/24", 3)}, "is missing"},
		{"only the backend's family is checked", "fd00:10:244:2::5", []netlink.Route{route("fd00:10:244:2::/64", 7)}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out KernelReport
			if err := checkTunnel(tunnelKernel{routes: c.routes}, Backend{IP: c.ip, Node: "n2"}, nodes, &out); err != nil {
				t.Fatal(err)
			}
			got := strings.Join(out.Differences, "; ")
			if (c.differ == "") != (got == "") || !strings.Contains(got, c.differ) {
				t.Errorf("differences %q, want %q", got, c.differ)
			}
			if len(out.Checked) != 1 {
				t.Errorf("checked %q, want one route", out.Checked)
			}
		})
	}
}
