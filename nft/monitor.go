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

// What others changed is kept per table as far as a notification says:
// rules added or deleted name their chain, elements their set, so a full
// sync reads back only those (an nft insert into the policy table's
// forward chain: one chain, 40 ms, where reading back the whole table of
// 10,000 policies over 150,000 pods took 0.9 s, every policy change
// waiting behind it). Anything else (a chain, set or the table itself made or
// deleted, a notification that cannot be read, notifications lost) reads
// the whole table back.

// foreign is what others changed in a table since a full sync last looked.
type foreign struct {
	all    bool            // unknown, or more than rules and elements
	chains map[string]bool // whose rules others added or deleted
	sets   map[string]bool // by kernel name, whose elements others added or deleted
}

// some reports whether others changed anything.
func (f *foreign) some() bool { return f != nil && (f.all || len(f.chains) > 0 || len(f.sets) > 0) }

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
	dirty  map[TableID]*foreign
}

func newMonitor(d Dialer, tables []TableID) *monitor {
	return &monitor{d: d, tables: tables, dirty: map[TableID]*foreign{}}
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
		w.dirty[t] = &foreign{all: true}
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
		w.dirty[t] = &foreign{all: true}
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

// changed drains the queued notifications and reports, once, what others
// changed in table since the last call, or may have (all).
func (w *monitor) changed(table TableID) *foreign {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.drain()
	if w.conn == nil {
		return &foreign{all: true}
	}
	c := w.dirty[table]
	delete(w.dirty, table)
	return c
}

// note records a notification's change of table: one chain's rules or one
// set's elements, or all.
func (w *monitor) note(t TableID, chain, set string) {
	f := w.dirty[t]
	if f == nil {
		f = &foreign{chains: map[string]bool{}, sets: map[string]bool{}}
		w.dirty[t] = f
	}
	switch {
	case f.all:
	case chain != "":
		f.chains[chain] = true
	case set != "":
		f.sets[set] = true
	default:
		f.all = true
	}
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
				w.touched(m)
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

// touched records what an nftables notification changed in a watched
// table; one it cannot read counts against each watched table of its
// family. Every object's first attribute type (1) is its table's name
// (NFTA_TABLE_NAME, NFTA_CHAIN_TABLE, NFTA_RULE_TABLE, NFTA_SET_TABLE,
// NFTA_SET_ELEM_LIST_TABLE, NFTA_OBJ_TABLE, ...); a rule's second
// (NFTA_RULE_CHAIN) is its chain's, an element list's (NFTA_SET_ELEM_LIST_SET)
// its set's.
func (w *monitor) touched(m syscall.NetlinkMessage) {
	msg := int(m.Header.Type) & 0xff
	if int(m.Header.Type)>>8 != unix.NFNL_SUBSYS_NFTABLES || msg == unix.NFT_MSG_NEWGEN || len(m.Data) < 4 {
		return
	}
	fam := nftables.TableFamily(m.Data[0])
	ad, err := netlink.NewAttributeDecoder(m.Data[4:])
	if err != nil {
		w.changedFamily(fam)
		return
	}
	var t TableID
	var name string
	for ad.Next() {
		switch ad.Type() {
		case 1:
			t = TableID{fam, ad.String()}
		case 2:
			name = ad.String()
		}
	}
	switch {
	case ad.Err() != nil || t.Name == "":
		w.changedFamily(fam)
	case !slices.Contains(w.tables, t):
	case (msg == unix.NFT_MSG_NEWRULE || msg == unix.NFT_MSG_DELRULE) && name != "":
		w.note(t, name, "")
	case (msg == unix.NFT_MSG_NEWSETELEM || msg == unix.NFT_MSG_DELSETELEM) && name != "":
		w.note(t, "", name)
	default:
		w.note(t, "", "")
	}
}

// changedFamily counts every watched table of fam as changed.
func (w *monitor) changedFamily(fam nftables.TableFamily) {
	for _, t := range w.tables {
		if t.Family == fam {
			w.dirty[t] = &foreign{all: true}
		}
	}
}
