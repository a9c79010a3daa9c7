package plugin

import (
	"crypto/rand"
	"fmt"
	"net"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// veth is what ADD needs to know about a new pair without looking it up.
type veth struct {
	host     netlink.Link // the host end as the kernel echoed it (or a lookup found it)
	podIndex int          // the pod end's ifindex in the pod's namespace
	podMAC   net.HardwareAddr
}

// createVeth asks the kernel for the whole pair in one RTM_NEWLINK: the host
// end up, with its MTU and already enslaved to the bridge; the pod end named
// ifname, with its MTU and a MAC of ours, born in the pod's namespace (but
// down: the kernel cannot open a veth end before the pair is complete).
// Every request that changes links holds the kernel's global rtnl lock, and
// pods started together queue on it; one request instead of create, look up,
// enslave, look up in the pod, look up again keeps that queue short. The
// kernel echoes the host end back (NLM_F_ECHO): its index, MAC and peer
// index, so no lookup follows either (but on kernels that do not echo).
func createVeth(hostName, ifname string, mtu, bridgeIndex int, podNS netns.NsHandle) (*veth, error) {
	podMAC, err := randomMAC()
	if err != nil {
		return nil, err
	}
	req := nl.NewNetlinkRequest(unix.RTM_NEWLINK, unix.NLM_F_CREATE|unix.NLM_F_EXCL|unix.NLM_F_ACK|unix.NLM_F_ECHO)
	up := nl.NewIfInfomsg(unix.AF_UNSPEC)
	up.Flags, up.Change = unix.IFF_UP, unix.IFF_UP
	req.AddData(up)
	req.AddData(nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(hostName)))
	req.AddData(nl.NewRtAttr(unix.IFLA_MTU, nl.Uint32Attr(uint32(mtu))))
	req.AddData(nl.NewRtAttr(unix.IFLA_MASTER, nl.Uint32Attr(uint32(bridgeIndex))))
	for _, a := range oneQueue() {
		req.AddData(a)
	}
	info := nl.NewRtAttr(unix.IFLA_LINKINFO, nil)
	info.AddRtAttr(nl.IFLA_INFO_KIND, nl.NonZeroTerminated("veth"))
	peer := info.AddRtAttr(nl.IFLA_INFO_DATA, nil).AddRtAttr(nl.VETH_INFO_PEER, nl.NewIfInfomsg(unix.AF_UNSPEC).Serialize())
	peer.AddRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(ifname))
	peer.AddRtAttr(unix.IFLA_MTU, nl.Uint32Attr(uint32(mtu)))
	peer.AddRtAttr(unix.IFLA_ADDRESS, podMAC)
	peer.AddRtAttr(unix.IFLA_NET_NS_FD, nl.Uint32Attr(uint32(podNS)))
	for _, a := range oneQueue() {
		peer.AddChild(a)
	}
	req.AddData(info)
	echo, err := execute(req)
	if err != nil {
		return nil, err
	}
	var l netlink.Link
	if echo != nil {
		l, err = netlink.LinkDeserialize(nil, echo)
	} else {
		// Older kernels do not echo new links: look it up.
		l, err = host.LinkByName(hostName)
	}
	if err != nil {
		return nil, fmt.Errorf("read back veth %s: %w", hostName, err)
	}
	return &veth{host: l, podIndex: l.Attrs().ParentIndex, podMAC: podMAC}, nil
}

// oneQueue asks for one transmit and one receive queue. A veth gets one
// queue of each per CPU otherwise, and the kernel then cuts the ones in use
// down to one (what a veth uses unless told otherwise), waiting for an RCU
// grace period per end while it holds the rtnl lock: with many pods at once
// that wait, not the work, was the queue every ADD stood in.
func oneQueue() []*nl.RtAttr {
	return []*nl.RtAttr{
		nl.NewRtAttr(unix.IFLA_NUM_TX_QUEUES, nl.Uint32Attr(1)),
		nl.NewRtAttr(unix.IFLA_NUM_RX_QUEUES, nl.Uint32Attr(1)),
	}
}

// execute sends req in the node's namespace and waits for the kernel's
// acknowledgement. It returns the RTM_NEWLINK the kernel echoes back for a
// request with NLM_F_ECHO, nil without one (or from a kernel that does not
// echo). It reads up to the acknowledgement, because the echo goes out
// before the request has fully succeeded (enslaving comes after it) and only
// the acknowledgement says whether it did.
func execute(req *nl.NetlinkRequest) ([]byte, error) {
	s, err := nl.GetNetlinkSocketAt(netns.None(), netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	if err := s.Send(req); err != nil {
		return nil, err
	}
	var echo []byte
	for {
		msgs, _, err := s.Receive()
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			if m.Header.Seq != req.Seq {
				continue
			}
			switch m.Header.Type {
			case unix.RTM_NEWLINK:
				echo = m.Data
			case unix.NLMSG_ERROR:
				if errno := int32(nl.NativeEndian().Uint32(m.Data[0:4])); errno != 0 {
					return nil, syscall.Errno(-errno)
				}
				return echo, nil
			}
		}
	}
}

// randomMAC is a random unicast, locally administered address, as the
// kernel would pick; choosing it here saves looking the pod end up.
func randomMAC() (net.HardwareAddr, error) {
	mac := make(net.HardwareAddr, 6)
	if _, err := rand.Read(mac); err != nil {
		return nil, err
	}
	mac[0] = mac[0]&^0x01 | 0x02
	return mac, nil
}
