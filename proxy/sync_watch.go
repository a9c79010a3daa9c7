package proxy

import (
	"errors"
	"syscall"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// A full sync must heal whatever someone else did to our table, but reading
// a 10,000-Service table back costs most of a second of kernel dumps. The
// kernel announces every committed change on the nftables multicast group;
// a watch listens there, so a full sync that finds nothing about our table
// queued (and nothing lost) trusts its record and skips the read-back.
//
// While anyone listens, the kernel builds a notification for every object
// every commit touches: a quarter of the time of programming 10,000
// Services from empty. So the watch leaves the group while the renderers
// commit, and the nftables generation, which every commit in the namespace
// advances by one, tells whether anyone else committed meanwhile.

// watchBuf bounds what others may change between two full syncs before the
// watch overflows, which only costs a read-back.
const watchBuf = 4 << 20

// foreignWatch records, per family, whether others may have changed our
// table. One watch serves the renderers of one namespace (both families
// share it, so neither listens while the other commits). Not for
// concurrent use: the proxier syncs its families one after the other.
type foreignWatch struct {
	d     Dialer
	conn  *netlink.Conn // nil: not listening, every family counts as changed
	buf   []byte
	dirty map[nftables.TableFamily]bool
}

func newForeignWatch(d Dialer) *foreignWatch {
	return &foreignWatch{d: d, dirty: map[nftables.TableFamily]bool{}}
}

// open starts listening unless it already does. Whatever happened before
// is unknown, so every family counts as changed once.
func (w *foreignWatch) open() {
	if w.conn != nil {
		return
	}
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: w.d.NetNS, Groups: 1 << (unix.NFNLGRP_NFTABLES - 1)})
	if err != nil {
		return // every full sync reads back instead
	}
	if err := forceBuffers(c, watchBuf, 0); err != nil {
		c.Close()
		return
	}
	w.conn, w.buf = c, make([]byte, 64<<10)
	w.changedAll()
}

func (w *foreignWatch) changedAll() {
	for _, fam := range Families {
		w.dirty[fam] = true
	}
}

// Close stops listening; it is open again on the next sync.
func (w *foreignWatch) Close() {
	if w.conn != nil {
		w.conn.Close()
		w.conn = nil
	}
}

// changed drains the queued notifications and reports, once, whether
// others changed family's netplane table since the last call, or may have.
func (w *foreignWatch) changed(family nftables.TableFamily) bool {
	w.drain()
	if w.conn == nil {
		return true
	}
	c := w.dirty[family]
	w.dirty[family] = false
	return c
}

func (w *foreignWatch) drain() {
	if w.conn == nil {
		return
	}
	raw, err := w.conn.SyscallConn()
	if err != nil {
		w.Close()
		return
	}
	var rerr error
	err = raw.Control(func(fd uintptr) {
		for {
			n, _, err := unix.Recvfrom(int(fd), w.buf, unix.MSG_DONTWAIT)
			switch {
			case errors.Is(err, unix.EAGAIN):
				return
			case errors.Is(err, unix.ENOBUFS):
				w.changedAll() // lost notifications: assume the worst
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
				if fam, ok := touchedFamily(m); ok {
					w.dirty[fam] = true
				}
			}
		}
	})
	if err != nil || rerr != nil {
		w.Close()
	}
}

// away leaves the group while fn commits through bw. If the generation
// moved by anything but the transactions bw committed (or could not be
// read), others committed unseen, and every family counts as changed.
func (w *foreignWatch) away(bw *batchWriter, fn func() error) error {
	if w.conn == nil {
		return fn()
	}
	// The generation is read before leaving: a commit in between is then
	// both counted and seen, never neither.
	g0, gerr := bw.generation()
	if gerr == nil {
		gerr = w.conn.LeaveGroup(unix.NFNLGRP_NFTABLES)
	}
	before := bw.commits
	err := fn()
	if merr := w.conn.JoinGroup(unix.NFNLGRP_NFTABLES); merr != nil {
		w.Close()
		return err
	}
	g1, gerr1 := bw.generation()
	if gerr != nil || gerr1 != nil || g1-g0 != uint32(bw.commits-before) {
		w.changedAll()
	}
	return err
}

// touchedFamily reports the family of the netplane table an nftables
// notification is about, if it is about one. Every object's first
// attribute type (1) is its table's name: NFTA_TABLE_NAME,
// NFTA_CHAIN_TABLE, NFTA_RULE_TABLE, NFTA_SET_TABLE,
// NFTA_SET_ELEM_LIST_TABLE, NFTA_OBJ_TABLE, ...
func touchedFamily(m syscall.NetlinkMessage) (nftables.TableFamily, bool) {
	if int(m.Header.Type)>>8 != unix.NFNL_SUBSYS_NFTABLES || int(m.Header.Type)&0xff == unix.NFT_MSG_NEWGEN || len(m.Data) < 4 {
		return 0, false
	}
	fam := nftables.TableFamily(m.Data[0])
	ad, err := netlink.NewAttributeDecoder(m.Data[4:])
	if err != nil {
		return fam, true
	}
	for ad.Next() {
		if ad.Type() == 1 {
			return fam, ad.String() == TableName
		}
	}
	return fam, ad.Err() != nil
}
