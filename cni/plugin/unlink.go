package plugin

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// DeleteLinkCommand, as the first argument, makes netplane-cni the helper
// process that removePair starts: `netplane-cni delete-link <ifindex>
// [<netnsid>]` deletes one link and exits.
const DeleteLinkCommand = "delete-link"

// removePair removes the veth pair whose host end is named name, and
// returns once neither end is in any namespace: both unlisted, closed,
// their addresses and routes gone, the host end off the bridge. It does not
// wait for what the kernel does after that: deleting a link makes the
// process that asked wait for an RCU barrier (a normal grace period, about
// 20 ms on this machine, see cni/README.md) before the request returns,
// and that wait frees memory, nothing a runtime or another pod can see. So
// the request is sent by a helper process (DeleteLinkCommand) that ends on
// its own once the kernel answers, and DEL returns on the kernel's
// RTM_DELLINK notification for the host end, which comes before the wait.
//
// The helper deletes the pod end (by its index in the pod's namespace,
// IFLA_TARGET_NETNSID): the kernel takes the named end first and its peer
// second, so the host end's notification says both are done. Whenever the
// helper cannot be watched or fails, the pair is deleted here, waiting.
func removePair(name string) error {
	l, err := host.LinkByName(name)
	if errors.As(err, &netlink.LinkNotFoundError{}) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("look up %s: %w", name, err)
	}
	events, err := subscribeRemoval(l.Attrs().Index)
	if err != nil {
		return deleteLink(name)
	}
	defer events.Close()
	gone := awaitRemoval(events, l.Attrs().Index)
	helper := exec.Command("/proc/self/exe", deleteLinkArgs(l.Attrs())...)
	if err := helper.Start(); err != nil {
		return deleteLink(name)
	}
	exited := make(chan error, 1)
	go func() { exited <- helper.Wait() }()
	select {
	case seen := <-gone:
		if seen {
			return nil
		}
		// The notifications were lost (the socket overran): the
		// helper's exit is then the only word.
		<-exited
	case <-exited:
	}
	// The helper is done, or failed; whatever it left, delete here.
	return deleteLink(name)
}

// deleteLinkArgs names the pod end when the host end knows its peer in
// another namespace, else the host end itself.
func deleteLinkArgs(a *netlink.LinkAttrs) []string {
	if a.ParentIndex > 0 && a.NetNsID >= 0 {
		return []string{DeleteLinkCommand, strconv.Itoa(a.ParentIndex), strconv.Itoa(a.NetNsID)}
	}
	return []string{DeleteLinkCommand, strconv.Itoa(a.Index)}
}

// subscribeRemoval listens to the node's link notifications, filtered in the
// kernel (a classic BPF socket filter) down to the deletion of link index.
// Unfiltered, every DEL in flight woke for every other pod's link changes:
// with 30 DELs at once on 2 CPUs that doubled DEL's p50 (measured
// 2026-12-02, load 18-31), and could overrun the socket.
func subscribeRemoval(index int) (*nl.NetlinkSocket, error) {
	s, err := nl.Subscribe(unix.NETLINK_ROUTE, unix.RTNLGRP_LINK)
	if err != nil {
		return nil, err
	}
	// BPF loads read big-endian; the message is in the host's order.
	var b [4]byte
	nl.NativeEndian().PutUint16(b[:], unix.RTM_DELLINK)
	typ := uint32(binary.BigEndian.Uint16(b[:]))
	nl.NativeEndian().PutUint32(b[:], uint32(index))
	idx := binary.BigEndian.Uint32(b[:])
	const nlmsgType, ifiFamily, ifiIndex = 4, unix.SizeofNlMsghdr, unix.SizeofNlMsghdr + 4
	filter := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_H | unix.BPF_ABS, K: nlmsgType},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: typ, Jf: 5},
		{Code: unix.BPF_LD | unix.BPF_B | unix.BPF_ABS, K: ifiFamily},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: unix.AF_UNSPEC, Jf: 3},
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: ifiIndex},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: idx, Jf: 1},
		{Code: unix.BPF_RET | unix.BPF_K, K: 0xffffffff},
		{Code: unix.BPF_RET | unix.BPF_K, K: 0},
	}
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	if err := unix.SetsockoptSockFprog(s.GetFd(), unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &prog); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// awaitRemoval reports true once the kernel announces the deletion of link
// index, false if the socket fails first.
func awaitRemoval(events *nl.NetlinkSocket, index int) <-chan bool {
	out := make(chan bool, 1)
	go func() {
		for {
			msgs, _, err := events.Receive()
			if err != nil {
				out <- false
				return
			}
			for _, m := range msgs {
				if m.Header.Type != unix.RTM_DELLINK {
					continue
				}
				// The bridge announces the port's removal (AF_BRIDGE)
				// before the link's own (AF_UNSPEC).
				if info := nl.DeserializeIfInfomsg(m.Data); info.Family == unix.AF_UNSPEC && int(info.Index) == index {
					out <- true
					return
				}
			}
		}
	}()
	return out
}

// DeleteLinkMain is the helper process: it deletes the link of args
// (ifindex, optionally the netnsid of its namespace) and returns the exit
// code. A link already gone is success.
func DeleteLinkMain(args []string) int {
	if err := deleteLinkByIndex(args); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

func deleteLinkByIndex(args []string) error {
	if len(args) < 1 || len(args) > 2 {
		return fmt.Errorf("usage: %s <ifindex> [<netnsid>]", DeleteLinkCommand)
	}
	index, err := strconv.Atoi(args[0])
	if err != nil {
		return err
	}
	req := nl.NewNetlinkRequest(unix.RTM_DELLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(index)
	req.AddData(msg)
	if len(args) == 2 {
		nsid, err := strconv.Atoi(args[1])
		if err != nil {
			return err
		}
		req.AddData(nl.NewRtAttr(unix.IFLA_TARGET_NETNSID, nl.Uint32Attr(uint32(nsid))))
	}
	if _, err := execute(req); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("delete link %v: %w", args, err)
	}
	return nil
}
