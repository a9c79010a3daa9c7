package nft

import (
	"errors"
	"fmt"
	"os"
)

// A Programmer converges one kernel table to a desired Table, sending only
// the difference, and remembers what it wrote. Its first sync reads the
// table back from the kernel, which is how it adopts a correct table at
// start-up without touching it; a full sync reads it back again when
// someone else changed it (monitor.go), which is how it heals whatever
// others changed or flushed.

// Syncer is what a feature programs its table through: the kernel's
// Programmer, or a Fake in tests.
type Syncer interface {
	// Sync makes the table equal to want. After a failure, or with full
	// when others changed the table, it first reads the table back so
	// their changes are repaired.
	Sync(want *Table, full bool) (Stats, error)
	// SyncTouched is a partial sync that compares only the touched parts
	// of want with what it remembers, so its cost follows the change, not
	// the table. A nil touched, or nothing remembered, means a whole-table
	// comparison.
	SyncTouched(want *Table, touched *Touched) (Stats, error)
	Close()
}

// Stats counts what one sync sent.
type Stats struct {
	Messages     int
	Transactions int
	ReadBack     bool // the table was read back from the kernel first
	// Reread counts the chains and sets read back first, those alone
	// that others changed.
	Reread int
}

// Dialer opens netlink sockets in one network namespace.
type Dialer struct {
	// NetNS is a file descriptor of the namespace; 0 means the caller's.
	NetNS int
}

// NamespaceDialer is a Dialer for the network namespace at path (such as
// /proc/PID/ns/net or a bind mount of it), and the closing of the file it
// holds, for when nothing dials with it any more.
func NamespaceDialer(path string) (Dialer, func() error, error) {
	f, err := os.Open(path)
	if err != nil {
		return Dialer{}, nil, fmt.Errorf("opening network namespace %s: %w", path, err)
	}
	return Dialer{NetNS: int(f.Fd())}, f.Close, nil
}

// kernelTable is what a programmer knows to be in the kernel.
type kernelTable struct {
	chains map[string]*kernelChain
	sets   map[string]*kernelSet // by the desired set's name
	// extra are sets read back under a second name of one desired set (a
	// replacement cut short): every chain reading the desired set is
	// rewritten to read the one in sets, and the extra deleted. Only a
	// read-back sets it, and the sync that read back compares everything.
	extra []string
}

func newKernelTable() *kernelTable {
	return &kernelTable{chains: map[string]*kernelChain{}, sets: map[string]*kernelSet{}}
}

type kernelChain struct {
	base  *Hook
	rules []string // fingerprints, in order
}

type kernelSet struct {
	spec SetSpec
	// elems are the ids in the kernel. After a sync they are the desired
	// set's own, shared read-only (adopt).
	elems elems
	name  string // the kernel's name for it: the desired set's, or another (sized.go)
	size  uint32 // the kernel's cap; 0: none
}

// only is the part of the record that touched names. Its chains and sets
// are the record's own (plan commits go to the whole record by name).
func (k *kernelTable) only(tc *Touched) *kernelTable {
	out := newKernelTable()
	copyNamed(out.chains, k.chains, tc.Chains)
	copyNamed(out.sets, k.sets, tc.Sets)
	for name, ids := range tc.Elems {
		if s := k.sets[name]; s != nil {
			out.sets[name] = &kernelSet{spec: s.spec, elems: elems{m: s.elems.pick(ids)}, name: s.name, size: s.size}
		}
	}
	return out
}

// kernel is what a programmer converges: a namespace's nftables over
// netlink, or a Fake's tables.
type kernel interface {
	// connect makes sure there is a connection; fresh says it is new, so
	// whatever the programmer remembers may be stale.
	connect() (fresh bool, err error)
	// changed reports, once, what others changed in table since the last
	// call, or may have; nil if nothing.
	changed(table TableID) *foreign
	// readBack lists table as a record; nil if there is no such table.
	readBack(table TableID) (*kernelTable, error)
	// reread reads back into k the chains and sets of table that f names
	// and k holds (f.all aside), and returns how many.
	reread(table TableID, k *kernelTable, f *foreign) (int, error)
	// send runs the plan's steps in transactions.
	send(p *plan) (Stats, error)
	// packets reads the counters of the table's chains (Packets).
	packets(chains []string) (map[string]uint64, error)
	// reset drops the connection after a failure: replies to a failed
	// batch may be left on it.
	reset()
	close()
}

// Programmer programs one table.
type Programmer struct {
	id      TableID
	k       kernel
	applied *kernelTable // nil: unknown, read it back before the next sync
}

var _ Syncer = (*Programmer)(nil)

// NewProgrammer programs table in the namespace of d.
func NewProgrammer(d Dialer, table TableID) *Programmer {
	return NewProgrammers(d, table)[0]
}

// NewProgrammers programs each of tables in the namespace of d. They share
// one monitor of the kernel's notifications, so that none makes the kernel
// notify it of another's commits, and they commit one at a time. Every
// call for the process's own namespace (the zero Dialer) shares one
// monitor, as the node role's features build their programmers apart;
// another namespace's programmers should be built by one call.
func NewProgrammers(d Dialer, tables ...TableID) []*Programmer {
	if d.NetNS == 0 {
		own.watch(tables)
		return programmersOn(own, tables)
	}
	return programmersOn(newMonitor(d, tables), tables)
}

// programmersOn programs each of tables in the namespace of m, sharing m.
func programmersOn(m *monitor, tables []TableID) []*Programmer {
	out := make([]*Programmer, len(tables))
	for i, t := range tables {
		out[i] = &Programmer{id: t, k: &netlinkKernel{dialer: m.d, id: t, mon: m}}
	}
	return out
}

// Table is the table the programmer converges.
func (p *Programmer) Table() TableID { return p.id }

// Close closes the programmer's connections and its monitor; a programmer
// sharing the monitor opens it again at its next sync and reads its table
// back once.
func (p *Programmer) Close() { p.k.close() }

// Sync makes the kernel table equal to want (see Syncer).
func (p *Programmer) Sync(want *Table, full bool) (Stats, error) {
	return p.syncCleanly(want, full, nil)
}

// SyncTouched is a partial sync of the touched parts of want (see Syncer).
func (p *Programmer) SyncTouched(want *Table, touched *Touched) (Stats, error) {
	return p.syncCleanly(want, false, touched)
}

func (p *Programmer) syncCleanly(want *Table, full bool, touched *Touched) (Stats, error) {
	if want.ID() != p.id {
		return Stats{}, fmt.Errorf("table %s given to the programmer of table %s", want.ID(), p.id)
	}
	st, err := p.sync(want, full, touched)
	if err != nil {
		p.k.reset()
		p.applied = nil // the next sync re-reads the kernel
	}
	return st, err
}

func (p *Programmer) sync(want *Table, full bool, touched *Touched) (Stats, error) {
	fresh, err := p.k.connect()
	if err != nil {
		return Stats{}, fmt.Errorf("opening an nftables netlink socket (needs CAP_NET_ADMIN): %w", err)
	}
	if fresh {
		p.applied = nil
	}
	var others *foreign
	if full || p.applied == nil {
		others = p.k.changed(p.id)
	}
	created, readBack := false, p.applied == nil || (full && others != nil && others.all)
	reread := 0
	if !readBack && full && others.some() {
		if reread, err = p.k.reread(p.id, p.applied, others); err != nil {
			return Stats{}, fmt.Errorf("reading back what others changed in table %s: %w", p.id, err)
		}
	}
	if readBack {
		k, err := p.k.readBack(p.id)
		if err != nil {
			return Stats{}, fmt.Errorf("reading table %s back: %w", p.id, err)
		}
		if k == nil {
			k, created = newKernelTable(), true
		}
		p.applied = k
	}
	have, part := p.applied, want
	if touched != nil && !readBack {
		have, part = have.only(touched), want.only(touched)
	}
	pl := newPlan(p.applied)
	err = pl.diff(have, part, created, part == want)
	if errors.Is(err, errCompareAll) {
		pl = newPlan(p.applied)
		err = pl.diff(p.applied, want, created, true)
	}
	if err != nil {
		return Stats{}, err
	}
	st, err := p.k.send(pl)
	st.ReadBack, st.Reread = readBack, reread
	if err != nil {
		return st, err
	}
	for _, c := range pl.commit {
		c(p.applied)
	}
	p.adopt(want)
	return st, nil
}

// adopt makes want's elements the record's after a successful sync,
// instead of a copy: the kernel now holds every element of want (a partial
// sync sent the touched ones, and its caller changed no other). The sets
// are marked adopted, so Set.Mutable copies them before they change.
func (p *Programmer) adopt(want *Table) {
	for name, s := range want.Sets {
		if ks := p.applied.sets[name]; ks != nil && !s.Spec.Dynamic {
			ks.elems = s.adopt()
		}
	}
}
