package nft

import (
	"errors"
	"slices"
	"sync"
	"syscall"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// A full sync must heal whatever someone else did to a table, but reading
// the proxy's table of 10,000 Services back costs most of a second of
// kernel dumps. The kernel announces every committed change on the
// nftables multicast group; a monitor listens there, so a full sync that
// finds nothing about its table queued (and nothing lost) trusts its record
// and skips the read-back.
//
// While anyone listens, the kernel builds a notification for every object
// every commit touches: a quarter of the time of programming 10,000
// Services from empty. So the monitor leaves the group while its
// programmers commit, and the nftables generation, which every commit in
// the namespace advances by one, tells whether anyone else committed
// meanwhile.

// monitorBuf bounds what others may change between two full syncs before
// the monitor overflows, which only costs a read-back.
const monitorBuf = 4 << 20

// monitor records, per table, whether others may have changed it. One
// monitor serves the programmers of one namespace (NewProgrammers), so none
// listens while another commits. Programmers that sync side by side (the
// proxy's and the NetworkPolicy tables) take turns: a commit holds the
// monitor from leaving the group to joining it again.
type monitor struct {
	d Dialer

	mu     sync.Mutex
	tables []TableID
	conn   *netlink.Conn // nil: not listening, every table counts as changed
	buf    []byte
	dirty  map[TableID]bool
}

func newMonitor(d Dialer, tables []TableID) *monitor {
	return &monitor{d: d, tables: tables, dirty: map[TableID]bool{}}
}

// own is the monitor of the process's own namespace, which every
// programmer of it shares (NewProgrammers with the zero Dialer): the node
// role builds the proxy's and the NetworkPolicy programmers apart, and one's
// monitor listening while the other commits made the kernel build a
// notification for every rule and element of the proxy's syncs.
var own = newMonitor(Dialer{}, nil)

// watch adds tables to those the monitor records; what happened to them
// before is unknown, so each counts as changed once.
func (w *monitor) watch(tables []TableID) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, t := range tables {
		if !slices.Contains(w.tables, t) {
			w.tables = append(w.tables, t)
		}
		w.dirty[t] = true
	}
}

// open starts listening unless it already does. Whatever happened before
// is unknown, so every table counts as changed once.
func (w *monitor) open() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.conn != nil {
		return
	}
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: w.d.NetNS, Groups: 1 << (unix.NFNLGRP_NFTABLES - 1)})
	if err != nil {
		return // every full sync reads back instead
	}
	if err := forceBuffers(c, monitorBuf, 0); err != nil {
		c.Close()
		return
	}
	w.conn, w.buf = c, make([]byte, 64<<10)
	w.changedAll()
}

func (w *monitor) changedAll() {
	for _, t := range w.tables {
		w.dirty[t] = true
	}
}

// Close stops listening; it is open again on the next sync.
func (w *monitor) Close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.close()
}

func (w *monitor) close() {
	if w.conn != nil {
		w.conn.Close()
		w.conn = nil
	}
}

// changed drains the queued notifications and reports, once, whether
// others changed table since the last call, or may have.
func (w *monitor) changed(table TableID) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.drain()
	if w.conn == nil {
		return true
	}
	c := w.dirty[table]
	w.dirty[table] = false
	return c
}

func (w *monitor) drain() {
	if w.conn == nil {
		return
	}
	raw, err := w.conn.SyscallConn()
	if err != nil {
		w.close()
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
				if t, ok := w.touchedTable(m); ok {
					w.dirty[t] = true
				}
			}
		}
	})
	if err != nil || rerr != nil {
		w.close()
	}
}

// away leaves the group while fn commits through bw. If the generation
// moved by anything but the transactions bw committed (or could not be
// read), others committed unseen, and every table counts as changed.
func (w *monitor) away(bw *batchWriter, fn func() error) error {
	w.mu.Lock()
	defer w.mu.Unlock()
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
		w.close()
		return err
	}
	g1, gerr1 := bw.generation()
	if gerr != nil || gerr1 != nil || g1-g0 != uint32(bw.commits-before) {
		w.changedAll()
	}
	return err
}

// touchedTable reports the table an nftables notification is about, if
// it is about one of those watched; a notification it cannot read is
// counted against each watched table of its family. Every object's first
// attribute type (1) is its table's name: NFTA_TABLE_NAME,
// NFTA_CHAIN_TABLE, NFTA_RULE_TABLE, NFTA_SET_TABLE,
// NFTA_SET_ELEM_LIST_TABLE, NFTA_OBJ_TABLE, ...
func (w *monitor) touchedTable(m syscall.NetlinkMessage) (TableID, bool) {
	if int(m.Header.Type)>>8 != unix.NFNL_SUBSYS_NFTABLES || int(m.Header.Type)&0xff == unix.NFT_MSG_NEWGEN || len(m.Data) < 4 {
		return TableID{}, false
	}
	fam := nftables.TableFamily(m.Data[0])
	ad, err := netlink.NewAttributeDecoder(m.Data[4:])
	if err != nil {
		w.changedFamily(fam)
		return TableID{}, false
	}
	for ad.Next() {
		if ad.Type() == 1 {
			t := TableID{fam, ad.String()}
			return t, slices.Contains(w.tables, t)
		}
	}
	if ad.Err() != nil {
		w.changedFamily(fam)
	}
	return TableID{}, false
}

// changedFamily counts every watched table of fam as changed.
func (w *monitor) changedFamily(fam nftables.TableFamily) {
	for _, t := range w.tables {
		if t.Family == fam {
			w.dirty[t] = true
		}
	}
}
