package explain

import (
	"net/netip"

	"github.com/vishvananda/netlink"
	"go4.org/netipx"
	"golang.org/x/sys/unix"

	"github.com/netplane/netplane/link"
	"github.com/netplane/netplane/nft"
	"github.com/netplane/netplane/nodeview"
	"github.com/netplane/netplane/overlay"
	"github.com/netplane/netplane/wireguard"
)

// netlinkKernel is the Kernel of the process's own network namespace.
type netlinkKernel struct {
	nodeview.Underlay
	h *netlink.Handle
}

// NewKernel reads the kernel of the caller's network namespace.
func NewKernel() (Kernel, func(), error) {
	h, err := netlink.NewHandle()
	if err != nil {
		return nil, nil, err
	}
	return &netlinkKernel{Underlay: nodeview.KernelUnderlay(h), h: h}, h.Close, nil
}

func (k *netlinkKernel) Table(id nft.TableID) (*nft.Table, error) {
	return nft.ReadTable(nft.Dialer{}, id)
}

func (k *netlinkKernel) Addrs() ([]netip.Addr, error) {
	as, err := link.Retry(func() ([]netlink.Addr, error) { return k.h.AddrList(nil, netlink.FAMILY_ALL) })
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range as {
		if p, ok := netipx.FromStdIPNet(a.IPNet); ok {
			out = append(out, p.Addr().Unmap())
		}
	}
	return out, nil
}

func (k *netlinkKernel) Routes() ([]netlink.Route, error) {
	var all []netlink.Route
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rs, err := link.Retry(func() ([]netlink.Route, error) { return k.h.RouteList(nil, fam) })
		if err != nil {
			return nil, err
		}
		all = append(all, rs...)
	}
	return all, nil
}

func (k *netlinkKernel) TunnelRoutes() ([]netlink.Route, error) {
	var all []netlink.Route
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rs, err := link.Retry(func() ([]netlink.Route, error) {
			return k.h.RouteListFiltered(fam, &netlink.Route{Table: wireguard.RouteTable}, netlink.RT_FILTER_TABLE)
		})
		if err != nil {
			return nil, err
		}
		all = append(all, rs...)
	}
	return all, nil
}

func (k *netlinkKernel) LinkName(index int) string {
	l, err := k.h.LinkByIndex(index)
	if err != nil {
		return ""
	}
	return l.Attrs().Name
}

func (k *netlinkKernel) Underlays(self nodeview.Node) ([]overlay.Underlay, error) {
	var out []overlay.Underlay
	for _, ip := range self.IPs {
		i, ok, err := k.InterfaceOf(ip)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, overlay.Underlay{Addr: ip, Index: i.Index, Name: i.Name, MTU: i.MTU})
		}
	}
	return out, nil
}

func (k *netlinkKernel) FDB(device string) ([]netlink.Neigh, error) {
	l, err := k.h.LinkByName(device)
	if err != nil {
		return nil, nil // no device: the check reports the entry missing
	}
	return link.Retry(func() ([]netlink.Neigh, error) { return k.h.NeighList(l.Attrs().Index, unix.AF_BRIDGE) })
}

func (k *netlinkKernel) Conntrack(fam nodeview.Family) ([]*netlink.ConntrackFlow, error) {
	f := netlink.InetFamily(unix.AF_INET)
	if fam == nodeview.IPv6 {
		f = unix.AF_INET6
	}
	return k.h.ConntrackTableList(netlink.ConntrackTable, f)
}
