package plugin

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"unsafe"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	"go4.org/netipx"
	"golang.org/x/sys/unix"

	"github.com/netplane/netplane/cni/conflist"
	"github.com/netplane/netplane/cni/ipam"
	"github.com/netplane/netplane/link"
)

// Funcs are the plugin's verbs for skel.PluginMainFuncs.
func Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: cmdAdd, Del: cmdDel, Check: cmdCheck, Status: cmdStatus, GC: cmdGC}
}

// VethName is the host end's name for an attachment: derived from the
// container ID and interface so DEL and GC find it without the pod's netns.
func VethName(containerID, ifname string) string {
	sum := sha256.Sum256([]byte(containerID + "/" + ifname))
	return conflist.VethPrefix + hex.EncodeToString(sum[:])[:12]
}

// host is the netlink handle of the node namespace the plugin runs in: one
// socket for the whole invocation (a zero Handle opens one per request).
var host = func() *netlink.Handle {
	if h, err := netlink.NewHandle(unix.NETLINK_ROUTE); err == nil {
		return h
	}
	return &netlink.Handle{}
}()

func cmdAdd(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	if err := conf.requireMTU(); err != nil {
		return err
	}
	if err := conf.requireRanges(); err != nil {
		return err
	}
	requested, err := conf.requested(args.Args)
	if err != nil {
		return err
	}
	ports, err := conf.portMappings()
	if err != nil {
		return err
	}
	pod, err := openPodNetns(args.Netns)
	if err != nil {
		return err
	}
	defer pod.Close()

	br, err := nodeBridge(conf)
	if err != nil {
		return types.NewError(types.ErrTryAgainLater, "cannot prepare the node bridge", err.Error())
	}
	if len(ports) > 0 {
		if err := allowLocalhost(conf.Bridge); err != nil {
			return err
		}
	}
	store, err := ipam.NewStore(conf.StateDir)
	if err != nil {
		return types.NewError(types.ErrIOFailure, "cannot open the IPAM store", err.Error())
	}
	att, err := allocate(store, conf, args, requested, ports)
	if err != nil {
		return err
	}
	success := false
	defer func() {
		if !success {
			rollback(store, conf, args, att)
		}
	}()
	res, err := setUp(conf, args, br, conf.MTU, pod, att)
	if err != nil {
		return err
	}
	// A result the runtime cannot read is a failed ADD: it gets rolled
	// back like any other failure.
	if err := types.PrintResult(res, conf.CNIVersion); err != nil {
		return err
	}
	success = true
	return nil
}

// nodeBridge is the node's bridge, up, with the gateway addresses. A bridge
// that is there and up is read with ioctls (index, flags, MAC), which take
// no lock: RTM_GETLINK takes the kernel's rtnl lock on Linux 6.18, the lock
// every pod's ADD and DEL queues on; the addresses are listed by a dump,
// which does not. Otherwise link.EnsureBridge makes it. That a device of
// this name is a bridge is what podnet made sure of; if it is not, the
// kernel refuses to enslave the veth (EOPNOTSUPP) and setUp asks
// link.EnsureBridge to say what the device is.
func nodeBridge(conf *NetConf) (*netlink.Bridge, error) {
	br, err := upLink(conf.Bridge)
	if err != nil {
		return link.EnsureBridge(host, conf.Bridge, conf.MTU, conf.gateways())
	}
	if err := link.EnsureAddrs(host, br, conf.gateways()); err != nil {
		return nil, err
	}
	return br, nil
}

// upLink reads the index and MAC of the node's link name, and fails unless
// it is up.
func upLink(name string) (*netlink.Bridge, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return nil, err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return nil, err
	}
	if ifr.Uint16()&unix.IFF_UP == 0 {
		return nil, fmt.Errorf("%s is down", name)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFINDEX, ifr); err != nil {
		return nil, err
	}
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name, Index: int(ifr.Uint32())}}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFHWADDR, ifr); err != nil {
		return nil, err
	}
	// ifr_hwaddr is a sockaddr: the family, then the address.
	raw := (*[unix.IFNAMSIZ + 16]byte)(unsafe.Pointer(ifr))
	br.HardwareAddr = net.HardwareAddr(append([]byte(nil), raw[unix.IFNAMSIZ+2:unix.IFNAMSIZ+8]...))
	return br, nil
}

// allocate records the attachment and programs its hostPorts in one locked
// store update: if the rules cannot be written the record is not kept.
func allocate(store *ipam.Store, conf *NetConf, args *skel.CmdArgs, requested []netip.Addr, ports []ipam.PortMapping) (ipam.Attachment, error) {
	var att ipam.Attachment
	err := store.Update(func(st *ipam.State) error {
		var err error
		att, err = st.Allocate(conf.ranges, ipam.Request{ContainerID: args.ContainerID, IfName: args.IfName, Requested: requested},
			VethName(args.ContainerID, args.IfName), ports)
		if err != nil || len(ports) == 0 {
			return err
		}
		return programHostPorts(st)
	})
	var full *ipam.ErrExhausted
	switch {
	case errors.As(err, &full):
		return att, types.NewError(types.ErrTryAgainLater, err.Error(), "")
	case errors.Is(err, ipam.ErrDuplicate):
		return att, types.NewError(types.ErrInternal, fmt.Sprintf("container %s already has interface %s: DEL it before adding it again", args.ContainerID, args.IfName), "")
	case err != nil:
		return att, types.NewError(types.ErrInternal, "IP allocation failed", err.Error())
	}
	return att, nil
}

// rollback undoes a failed ADD after allocation: the host veth (its pod
// end goes with it), the record, and the hostPort rules.
func rollback(store *ipam.Store, conf *NetConf, args *skel.CmdArgs, att ipam.Attachment) {
	_ = deleteLink(att.HostVeth)
	_ = store.Update(func(st *ipam.State) error {
		st.Release(args.ContainerID, args.IfName)
		if len(att.PortMappings) == 0 {
			return nil
		}
		return programHostPorts(st)
	})
}

func setUp(conf *NetConf, args *skel.CmdArgs, br *netlink.Bridge, mtu int, pod *podNetns, att ipam.Attachment) (*current.Result, error) {
	v, err := addVeth(br, att.HostVeth, args.IfName, mtu, pod)
	if errors.Is(err, unix.EOPNOTSUPP) {
		if _, berr := link.EnsureBridge(host, conf.Bridge, conf.MTU, conf.gateways()); berr != nil {
			return nil, berr
		}
	}
	if err != nil {
		return nil, err
	}
	if err := configurePod(pod.nl, v.podIndex, args.IfName, att.IPs); err != nil {
		return nil, err
	}
	res := &current.Result{
		CNIVersion: current.ImplementedSpecVersion,
		Interfaces: []*current.Interface{
			{Name: br.Attrs().Name, Mac: br.Attrs().HardwareAddr.String()},
			{Name: att.HostVeth, Mac: v.host.Attrs().HardwareAddr.String(), Mtu: mtu},
			{Name: args.IfName, Mac: v.podMAC.String(), Mtu: mtu, Sandbox: args.Netns},
		},
		DNS: conf.DNS,
	}
	for _, ip := range att.IPs {
		gw := ipam.Gateway(ip.Masked()).AsSlice()
		res.IPs = append(res.IPs, &current.IPConfig{Interface: current.Int(2), Address: *netipx.PrefixIPNet(ip), Gateway: gw})
		res.Routes = append(res.Routes, &types.Route{Dst: defaultDst(ip.Addr()), GW: gw})
	}
	return res, nil
}

// defaultDst is the default route's destination in a's family.
func defaultDst(a netip.Addr) net.IPNet {
	any := netip.IPv6Unspecified()
	if a.Is4() {
		any = netip.IPv4Unspecified()
	}
	return *netipx.PrefixIPNet(netip.PrefixFrom(any, 0))
}
