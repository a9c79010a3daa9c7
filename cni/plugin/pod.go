package plugin

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/netplane/netplane/cni/ipam"
	"github.com/netplane/netplane/cni/link"
)

// addVeth creates the pair with each end born in its final namespace (the
// pod end named ifname in podNS, the host end on the node), so nothing is
// moved or renamed: moving links between namespaces serialises on the
// kernel's rtnl lock and is the slow part of pod start-up under load.
func addVeth(br *netlink.Bridge, hostName, ifname string, mtu int, podNS netns.NsHandle, pod *netlink.Handle) (netlink.Link, error) {
	attrs := netlink.NewLinkAttrs()
	attrs.Name = hostName
	attrs.MTU = mtu
	attrs.Flags = net.FlagUp
	veth := &netlink.Veth{LinkAttrs: attrs, PeerName: ifname, PeerNamespace: netlink.NsFd(int(podNS))}
	err := host.LinkAdd(veth)
	if errors.Is(err, unix.EEXIST) {
		// Leftovers of an earlier attachment: a host end of this very
		// attachment (its name is derived from the container ID) left by a
		// killed plugin or released by DEL, or a released pair in a netns
		// that was reused. Replace them.
		if derr := deleteLink(hostName); derr != nil {
			return nil, derr
		}
		if derr := deleteCutOff(pod, ifname); derr != nil {
			return nil, derr
		}
		err = host.LinkAdd(veth)
	}
	if errors.Is(err, unix.EEXIST) {
		return nil, fmt.Errorf("interface %s already exists in the pod's network namespace: DEL the old attachment or choose another CNI_IFNAME", ifname)
	}
	if err != nil {
		return nil, fmt.Errorf("create veth %s (pod end %s): %w", hostName, ifname, err)
	}
	l, err := host.LinkByName(hostName)
	if err != nil {
		return nil, fmt.Errorf("look up veth %s: %w", hostName, err)
	}
	if err := host.LinkSetMasterByIndex(l, br.Attrs().Index); err != nil {
		return nil, fmt.Errorf("attach %s to bridge %s: %w", hostName, br.Attrs().Name, err)
	}
	// Hairpin lets a pod reach itself through a Service or hostPort whose
	// DNAT sends the packet back out of the port it came in on.
	if err := host.LinkSetHairpin(l, true); err != nil {
		return nil, fmt.Errorf("set hairpin on %s: %w", hostName, err)
	}
	return l, nil
}

// configurePod gives the pod end its addresses, brings it up and adds a
// default route per family via the bridge's gateway address.
func configurePod(pod *netlink.Handle, podNS netns.NsHandle, ifname string, ips []netip.Prefix) (netlink.Link, error) {
	l, err := pod.LinkByName(ifname)
	if err != nil {
		return nil, fmt.Errorf("find %s in the pod: %w", ifname, err)
	}
	for _, ip := range ips {
		if ip.Addr().Is6() {
			// Duplicate address detection would keep the address tentative
			// (unusable) for a second or more after ADD returns.
			if err := inNS(podNS, func() error { return link.Sysctl("net/ipv6/conf/"+ifname+"/accept_dad", "0") }); err != nil {
				return nil, err
			}
			break
		}
	}
	for _, ip := range ips {
		a := &netlink.Addr{IPNet: link.IPNet(ip)}
		if ip.Addr().Is6() {
			a.Flags = unix.IFA_F_NODAD
		}
		if err := pod.AddrAdd(l, a); err != nil {
			return nil, fmt.Errorf("add %s to %s in the pod: %w", ip, ifname, err)
		}
	}
	if err := pod.LinkSetUp(l); err != nil {
		return nil, fmt.Errorf("set %s up in the pod: %w", ifname, err)
	}
	for _, ip := range ips {
		dst := defaultDst(ip.Addr())
		r := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: &dst, Gw: ipam.Gateway(ip.Masked()).AsSlice()}
		if err := pod.RouteAdd(r); err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("add default route via %s in the pod: %w", r.Gw, err)
		}
	}
	return pod.LinkByName(ifname) // fresh attributes (MAC) for the result
}

// deleteCutOff deletes the pod's ifname if it is the peer of a host veth
// that DEL labelled Released.
func deleteCutOff(pod *netlink.Handle, ifname string) error {
	l, err := pod.LinkByName(ifname)
	if err != nil {
		return nil
	}
	if _, ok := l.(*netlink.Veth); !ok {
		return nil
	}
	peer, err := host.LinkByIndex(l.Attrs().ParentIndex)
	if err != nil || !strings.HasPrefix(peer.Attrs().Name, vethPrefix) || peer.Attrs().Alias != Released {
		return nil
	}
	return deleteLink(peer.Attrs().Name)
}

// deleteLink removes a host link; a missing one is fine.
func deleteLink(name string) error {
	l, err := host.LinkByName(name)
	var notFound netlink.LinkNotFoundError
	if errors.As(err, &notFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("look up %s: %w", name, err)
	}
	if err := host.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("delete %s: %w", name, err)
	}
	return nil
}

// inNS runs fn on this OS thread switched into ns; /proc/sys/net follows
// the thread's network namespace.
func inNS(ns netns.NsHandle, fn func() error) error {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer orig.Close()
	if err := netns.Set(ns); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("enter the pod's network namespace: %w", err)
	}
	ferr := fn()
	if err := netns.Set(orig); err != nil {
		// Stay locked: the thread is in the wrong namespace and must die.
		return fmt.Errorf("leave the pod's network namespace: %w", err)
	}
	runtime.UnlockOSThread()
	return ferr
}
