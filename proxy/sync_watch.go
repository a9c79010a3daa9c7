package proxy

import (
	"encoding/binary"
	"errors"
	"syscall"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// A full sync must heal whatever someone else did to our table, but reading
// a 10,000-Service table back costs seconds of kernel dumps. The kernel
// announces every committed change on the nftables multicast group, with the
// netlink port of the socket that made it; a watch listens there, with a
// socket filter that drops the renderer's own changes in the kernel, so
// what it queues between two full syncs is only what others did. A full
// sync drains it: nothing about our table (and nothing lost) means the
// kernel still holds what the renderer last wrote, and the read-back is
// skipped.

// watchBuf bounds what others may change between two full syncs before the
// watch overflows, which only costs a read-back.
const watchBuf = 4 << 20

type foreignWatch struct {
	conn *netlink.Conn
	buf  []byte
}

// openWatch subscribes to nftables notifications in the dialer's namespace,
// ignoring those caused by the netlink port own.
func openWatch(d Dialer, own uint32) (*foreignWatch, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: d.NetNS, Groups: 1 << (unix.NFNLGRP_NFTABLES - 1)})
	if err != nil {
		return nil, err
	}
	raw, err := c.SyscallConn()
	if err != nil {
		c.Close()
		return nil, err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = errors.Join(
			unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, watchBuf),
			unix.SetsockoptSockFprog(int(fd), unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, ownFilter(own)))
	}); err != nil || serr != nil {
		c.Close()
		return nil, errors.Join(err, serr)
	}
	return &foreignWatch{conn: c, buf: make([]byte, 64<<10)}, nil
}

// ownFilter is a socket filter dropping messages whose nlmsg_pid is own.
// BPF loads words big-endian; the header is in host order.
func ownFilter(own uint32) *unix.SockFprog {
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], own)
	prog := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 12}, // nlmsghdr.nlmsg_pid
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 1, K: binary.BigEndian.Uint32(b[:])},
		{Code: unix.BPF_RET | unix.BPF_K, K: 0},
		{Code: unix.BPF_RET | unix.BPF_K, K: 0xffffffff},
	}
	return &unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
}

func (w *foreignWatch) Close() { w.conn.Close() }

// changed drains the queued notifications and reports whether one of them
// touched family's netplane table, or some were lost (the socket overflowed).
func (w *foreignWatch) changed(family nftables.TableFamily) (bool, error) {
	raw, err := w.conn.SyscallConn()
	if err != nil {
		return true, err
	}
	touched := false
	var rerr error
	if err := raw.Control(func(fd uintptr) {
		for {
			n, _, err := unix.Recvfrom(int(fd), w.buf, unix.MSG_DONTWAIT)
			switch {
			case errors.Is(err, unix.EAGAIN):
				return
			case errors.Is(err, unix.ENOBUFS):
				touched = true // lost notifications: assume the worst
				continue
			case errors.Is(err, unix.EINTR):
				continue
			case err != nil:
				rerr = err
				return
			}
			msgs, err := syscall.ParseNetlinkMessage(w.buf[:n])
			if err != nil {
				rerr = err
				return
			}
			for _, m := range msgs {
				touched = touched || touchesTable(m, family)
			}
		}
	}); err != nil {
		return true, err
	}
	return touched || rerr != nil, rerr
}

// touchesTable reports whether an nftables notification is about the
// netplane table of family. Every object's first attribute type (1) is
// its table's name: NFTA_TABLE_NAME, NFTA_CHAIN_TABLE, NFTA_RULE_TABLE,
// NFTA_SET_TABLE, NFTA_SET_ELEM_LIST_TABLE, NFTA_OBJ_TABLE, ...
func touchesTable(m syscall.NetlinkMessage, family nftables.TableFamily) bool {
	if int(m.Header.Type)>>8 != unix.NFNL_SUBSYS_NFTABLES || int(m.Header.Type)&0xff == unix.NFT_MSG_NEWGEN || len(m.Data) < 4 {
		return false
	}
	if nftables.TableFamily(m.Data[0]) != family {
		return false
	}
	ad, err := netlink.NewAttributeDecoder(m.Data[4:])
	if err != nil {
		return true
	}
	for ad.Next() {
		if ad.Type() == 1 {
			return ad.String() == TableName
		}
	}
	return ad.Err() != nil
}
