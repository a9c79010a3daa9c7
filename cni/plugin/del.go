package plugin

import (
	"errors"
	"fmt"
	"strings"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/netplane/netplane/cni/ipam"
	"github.com/netplane/netplane/cni/link"
)

// cmdDel undoes an ADD. It needs neither the pod's netns nor an earlier
// successful ADD: the host veth name is derived from the attachment; the
// record and its hostPort rules go in one store update. The pod is cut off
// first, so an address is never released while a pod still uses it.
func cmdDel(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	if err := disconnect(args); err != nil {
		return types.NewError(types.ErrTryAgainLater, "cannot remove the pod's veth", err.Error())
	}
	store, err := ipam.NewStore(conf.StateDir)
	if err != nil {
		return types.NewError(types.ErrIOFailure, "cannot open the IPAM store", err.Error())
	}
	return store.Update(func(st *ipam.State) error {
		a, ok := st.Release(args.ContainerID, args.IfName)
		if !ok || len(a.PortMappings) == 0 {
			return nil
		}
		return programHostPorts(st)
	})
}

// disconnect cuts the pod off the node. Deleting a veth costs 15-20 ms of
// kernel time (unregistering waits for RCU grace periods), and so would
// setting it down, both under the kernel's global rtnl lock, which makes
// parallel DELs queue behind each other. While the pod's netns still
// exists, the runtime is about to remove it, and the kernel then destroys
// the pair in the background; so here the pod end only loses its addresses
// (no address of it stays configured once it is released) and the host end
// is labelled Released (an interface alias, visible in `ip link`). Without
// the netns, the host end is deleted at once. Released pairs of a netns
// that outlives its DEL are removed by the next ADD into it or by GC.
func disconnect(args *skel.CmdArgs) error {
	hostName := VethName(args.ContainerID, args.IfName)
	if args.Netns == "" {
		return deleteLink(hostName)
	}
	podNS, err := netns.GetFromPath(args.Netns)
	if err != nil {
		return deleteLink(hostName) // the netns is gone, and the pod end with it
	}
	defer podNS.Close()
	pod, err := netlink.NewHandleAt(podNS, unix.NETLINK_ROUTE)
	if err != nil {
		return deleteLink(hostName)
	}
	defer pod.Close()
	if ok, err := cutOff(pod, args.IfName, hostName); ok || err != nil {
		return err
	}
	return deleteLink(hostName)
}

// Released is the alias of a host veth whose attachment DEL released.
const Released = "netplane-cni: released"

// cutOff removes the addresses of the pod's ifname and labels its host end
// Released, if ifname is the peer of hostName; it reports whether it was.
func cutOff(pod *netlink.Handle, ifname, hostName string) (bool, error) {
	l, err := pod.LinkByName(ifname)
	if err != nil {
		return false, nil
	}
	peer, err := host.LinkByIndex(l.Attrs().ParentIndex)
	if err != nil || peer.Attrs().Name != hostName {
		return false, nil
	}
	addrs, err := link.Retry(func() ([]netlink.Addr, error) { return pod.AddrList(l, netlink.FAMILY_ALL) })
	if err != nil {
		return false, err
	}
	for _, a := range addrs {
		if a.IP.IsLinkLocalUnicast() {
			continue
		}
		if err := pod.AddrDel(l, &a); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return false, fmt.Errorf("remove %s from %s in the pod: %w", a.IPNet, ifname, err)
		}
	}
	if err := host.LinkSetAlias(peer, Released); err != nil {
		return false, fmt.Errorf("label %s released: %w", hostName, err)
	}
	return true, nil
}

// cmdGC releases every attachment not in cni.dev/valid-attachments, and
// removes veths on our bridge that belong to no attachment (left by a
// plugin killed between creating a veth and recording it). It continues past
// errors and reports them all at the end.
func cmdGC(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	valid := map[types.GCAttachment]bool{}
	for _, a := range conf.ValidAttachments {
		valid[a] = true
	}
	store, err := ipam.NewStore(conf.StateDir)
	if err != nil {
		return types.NewError(types.ErrIOFailure, "cannot open the IPAM store", err.Error())
	}
	keep := map[string]bool{}
	var errs []error
	err = store.Update(func(st *ipam.State) error {
		for _, a := range append([]ipam.Attachment(nil), st.Attachments...) {
			if valid[types.GCAttachment{ContainerID: a.ContainerID, IfName: a.IfName}] {
				keep[a.HostVeth] = true
				continue
			}
			st.Release(a.ContainerID, a.IfName)
		}
		return programHostPorts(st)
	})
	if err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, removeStrayVeths(conf.Bridge, keep)...)
	if err := errors.Join(errs...); err != nil {
		return types.NewError(types.ErrTryAgainLater, "garbage collection was incomplete", err.Error())
	}
	return nil
}

func removeStrayVeths(bridge string, keep map[string]bool) []error {
	br, err := host.LinkByName(bridge)
	if err != nil {
		return nil // no bridge, no pods
	}
	links, err := link.Retry(host.LinkList)
	if err != nil {
		return []error{fmt.Errorf("list links: %w", err)}
	}
	var errs []error
	for _, l := range links {
		name := l.Attrs().Name
		if _, ok := l.(*netlink.Veth); !ok || !strings.HasPrefix(name, vethPrefix) || (keep[name] && l.Attrs().Alias != Released) || l.Attrs().MasterIndex != br.Attrs().Index {
			continue
		}
		if err := deleteLink(name); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}
