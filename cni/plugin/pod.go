package plugin

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"go4.org/netipx"
	"golang.org/x/sys/unix"

	"github.com/netplane/netplane/cni/ipam"
)

// addVeth creates the pair (createVeth) and turns hairpin on for the host
// end. A leftover of the same name is replaced.
func addVeth(br *netlink.Bridge, hostName, ifname string, mtu int, pod *podNetns) (*veth, error) {
	v, err := createVeth(hostName, ifname, mtu, br.Attrs().Index, pod.ns)
	if errors.Is(err, unix.EEXIST) {
		// A host end of this very attachment (its name is derived from
		// the container ID) left by a killed plugin: replace it.
		if derr := deleteLink(hostName); derr != nil {
			return nil, derr
		}
		v, err = createVeth(hostName, ifname, mtu, br.Attrs().Index, pod.ns)
	}
	if errors.Is(err, unix.EEXIST) {
		return nil, fmt.Errorf("interface %s already exists in the pod's network namespace: DEL the old attachment or choose another CNI_IFNAME", ifname)
	}
	if err != nil {
		return nil, fmt.Errorf("create veth %s (pod end %s) on bridge %s: %w", hostName, ifname, br.Attrs().Name, err)
	}
	// Hairpin lets a pod reach itself through a Service or hostPort whose
	// DNAT sends the packet back out of the port it came in on. The kernel
	// takes bridge port flags only once the port exists, so this is a
	// request of its own.
	if err := host.LinkSetHairpin(v.host, true); err != nil {
		return nil, fmt.Errorf("set hairpin on %s: %w", hostName, err)
	}
	return v, nil
}

// configurePod gives the pod end its addresses, brings it up and adds a
// default route per family via the bridge's gateway address. IPv6 addresses
// skip duplicate address detection (IFA_F_NODAD), which would keep them
// tentative, unusable, for a second or more after ADD returns.
func configurePod(pod *netlink.Handle, podIndex int, ifname string, ips []netip.Prefix) error {
	l := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: podIndex, Name: ifname}}
	for _, ip := range ips {
		a := &netlink.Addr{IPNet: netipx.PrefixIPNet(ip)}
		if ip.Addr().Is6() {
			a.Flags = unix.IFA_F_NODAD
		}
		if err := pod.AddrAdd(l, a); err != nil {
			return fmt.Errorf("add %s to %s in the pod: %w", ip, ifname, err)
		}
	}
	if err := pod.LinkSetUp(l); err != nil {
		return fmt.Errorf("set %s up in the pod: %w", ifname, err)
	}
	for _, ip := range ips {
		dst := defaultDst(ip.Addr())
		r := &netlink.Route{LinkIndex: podIndex, Dst: &dst, Gw: ipam.Gateway(ip.Masked()).AsSlice()}
		if err := pod.RouteAdd(r); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("add default route via %s in the pod: %w", r.Gw, err)
		}
	}
	return nil
}

// deleteLink removes a link of the node by name; a missing one is fine.
// Deleting either end of a veth removes both. It is one request, naming
// the link (IFLA_IFNAME), instead of a lookup and a delete by index.
func deleteLink(name string) error {
	req := nl.NewNetlinkRequest(unix.RTM_DELLINK, unix.NLM_F_ACK)
	req.AddData(nl.NewIfInfomsg(unix.AF_UNSPEC))
	req.AddData(nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(name)))
	if _, err := execute(req); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("delete %s: %w", name, err)
	}
	return nil
}

// podNetns is the pod's network namespace (CNI_NETNS) and a netlink handle
// in it.
type podNetns struct {
	ns netns.NsHandle
	nl *netlink.Handle
}

// openPodNetns opens CNI_NETNS for ADD and CHECK. A path that cannot be
// opened is the runtime's error, reported as such (code 4).
func openPodNetns(path string) (*podNetns, error) {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("CNI_NETNS=%s cannot be opened", path), err.Error())
	}
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		ns.Close()
		return nil, fmt.Errorf("open netlink in %s: %w", path, err)
	}
	return &podNetns{ns: ns, nl: h}, nil
}

func (p *podNetns) Close() {
	p.nl.Close()
	p.ns.Close()
}
