package plugin

import (
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	"go4.org/netipx"

	"github.com/netplane/netplane/cni/ipam"
	"github.com/netplane/netplane/link"
)

// cmdCheck verifies that what prevResult describes is still in place: the
// IPAM record, the host veth on the bridge, the bridge's gateway addresses,
// the pod interface with its addresses and default routes, and the hostPort
// rules of the pod's host ports.
func cmdCheck(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	raw, err := conf.prevResult()
	if err != nil {
		return err
	}
	if raw == nil {
		return invalidConf("CHECK needs prevResult: the runtime must pass the result of ADD")
	}
	prev, err := current.NewResultFromResult(raw)
	if err != nil {
		return types.NewError(types.ErrDecodingFailure, "cannot convert prevResult", err.Error())
	}
	var want []netip.Prefix
	for _, ip := range prev.IPs {
		p, _ := netipx.FromStdIPNet(&ip.Address)
		want = append(want, p)
	}
	store, err := ipam.NewStore(conf.StateDir)
	if err != nil {
		return err
	}
	st, err := store.Read()
	if err != nil {
		return err
	}
	att, ok := st.Find(args.ContainerID, args.IfName)
	if !ok {
		return types.NewError(types.ErrUnknownContainer, fmt.Sprintf("no IP allocation is recorded for container %s interface %s", args.ContainerID, args.IfName), "")
	}
	if !sameSet(att.IPs, want) {
		return fmt.Errorf("recorded addresses %v differ from prevResult's %v", att.IPs, want)
	}
	if err := checkHost(conf, att); err != nil {
		return err
	}
	if len(att.PortMappings) > 0 {
		if err := checkHostPorts(att); err != nil {
			return err
		}
	}
	return checkPod(args, att.IPs)
}

func sameSet(a, b []netip.Prefix) bool {
	return len(a) == len(b) && !slices.ContainsFunc(a, func(p netip.Prefix) bool { return !slices.Contains(b, p) })
}

// firstMissing returns the first of want that l does not carry.
func firstMissing(h *netlink.Handle, l netlink.Link, want []netip.Prefix) (netip.Prefix, error) {
	addrs, err := link.Retry(func() ([]netlink.Addr, error) { return h.AddrList(l, netlink.FAMILY_ALL) })
	if err != nil {
		return netip.Prefix{}, err
	}
	for _, w := range want {
		if !slices.ContainsFunc(addrs, func(a netlink.Addr) bool { p, _ := netipx.FromStdIPNet(a.IPNet); return p == w }) {
			return w, nil
		}
	}
	return netip.Prefix{}, nil
}

func checkHost(conf *NetConf, att ipam.Attachment) error {
	br, err := host.LinkByName(conf.Bridge)
	if err != nil {
		return fmt.Errorf("bridge %s is missing: %w", conf.Bridge, err)
	}
	var gws []netip.Prefix
	for _, ip := range att.IPs {
		gws = append(gws, netip.PrefixFrom(ipam.Gateway(ip.Masked()), ip.Bits()))
	}
	if missing, err := firstMissing(host, br, gws); err != nil {
		return err
	} else if missing.IsValid() {
		return fmt.Errorf("bridge %s lacks its gateway address %s", conf.Bridge, missing)
	}
	veth, err := host.LinkByName(att.HostVeth)
	if err != nil {
		return fmt.Errorf("host veth %s is missing: %w", att.HostVeth, err)
	}
	if veth.Attrs().MasterIndex != br.Attrs().Index {
		return fmt.Errorf("host veth %s is not attached to bridge %s", att.HostVeth, conf.Bridge)
	}
	return nil
}

func checkPod(args *skel.CmdArgs, ips []netip.Prefix) error {
	pod, err := openPodNetns(args.Netns)
	if err != nil {
		return err
	}
	defer pod.Close()
	l, err := pod.nl.LinkByName(args.IfName)
	if err != nil {
		return fmt.Errorf("interface %s is missing in the pod: %w", args.IfName, err)
	}
	if missing, err := firstMissing(pod.nl, l, ips); err != nil {
		return err
	} else if missing.IsValid() {
		return fmt.Errorf("pod interface %s lacks address %s", args.IfName, missing)
	}
	for _, ip := range ips {
		if err := checkDefaultRoute(pod.nl, l, ip); err != nil {
			return err
		}
	}
	return nil
}

func checkDefaultRoute(pod *netlink.Handle, l netlink.Link, ip netip.Prefix) error {
	fam := netlink.FAMILY_V4
	if ip.Addr().Is6() {
		fam = netlink.FAMILY_V6
	}
	routes, err := link.Retry(func() ([]netlink.Route, error) { return pod.RouteList(l, fam) })
	if err != nil {
		return err
	}
	gw := net.IP(ipam.Gateway(ip.Masked()).AsSlice())
	for _, r := range routes {
		if link.IsDefault(r.Dst) && r.Gw.Equal(gw) {
			return nil
		}
	}
	return fmt.Errorf("pod has no default route via %s", gw)
}

// cmdStatus answers whether ADD can work now: the node has a pod CIDR and
// its bridge is up. It reads only the config and one link: kubelet asks
// every few seconds.
func cmdStatus(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	if conf.rangesErr != nil {
		return conf.rangesErr
	}
	if len(conf.ranges) == 0 {
		return types.NewError(types.ErrPluginNotAvailable, "the node has no pod CIDR yet", "netplane --role=node writes podCIDRs once the Node has spec.podCIDRs")
	}
	br, err := host.LinkByName(conf.Bridge)
	if err != nil {
		return types.NewError(types.ErrPluginNotAvailable, fmt.Sprintf("bridge %s does not exist yet", conf.Bridge), "netplane --role=node creates it; is it running?")
	}
	if br.Attrs().Flags&net.FlagUp == 0 {
		return types.NewError(types.ErrPluginNotAvailable, fmt.Sprintf("bridge %s is down", conf.Bridge), "")
	}
	return nil
}
