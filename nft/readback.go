package nft

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// dumper lists objects of one table over a socket of its own, for one
// read-back; close it after.
type dumper struct {
	c     *netlink.Conn
	table TableID
	buf   []byte
}

func (d Dialer) dumper(table TableID) (*dumper, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: d.NetNS})
	if err != nil {
		return nil, err
	}
	if err := bigBuffers(c); err != nil {
		c.Close()
		return nil, err
	}
	return &dumper{c: c, table: table, buf: make([]byte, 64<<10)}, nil
}

func (d *dumper) close() { d.c.Close() }

// ruleFingerprints lists the fingerprints of the rules of the table, by
// chain and in order: one netlink dump per chain. Expressions are
// not decoded: the fingerprint in each rule's comment says what it is. A
// dump of the whole table would cost O(rules²): the kernel fills one
// buffer of at most 32 KiB per round and starts each round from the
// table's first rule; a chain is found by its name's hash.
func (d *dumper) ruleFingerprints(chains []string) (map[string][]string, error) {
	out := make(map[string][]string, len(chains))
	for _, chain := range chains {
		var fps []string
		err := d.dump(unix.NFT_MSG_GETRULE, unix.NFTA_RULE_TABLE, unix.NFTA_RULE_CHAIN, chain, func() { fps = nil }, func(msg []byte) {
			fp := ""
			if b := value(msg, unix.NFTA_RULE_USERDATA); b != nil {
				fp, _ = userdata.GetString(b, userdata.TypeComment)
			}
			fps = append(fps, fp)
		}, nil)
		if err != nil {
			return nil, fmt.Errorf("listing the rules of chain %s: %w", chain, err)
		}
		out[chain] = fps
	}
	return out, nil
}

// setElementIDs lists the elements of the table's named sets (none
// dynamic), as ids by set. They are decoded from the kernel's messages as
// they arrive: google/nftables builds every element of a set, with several
// buffers each, before returning them (300 MB of garbage to adopt the
// 220,000 elements of the proxy's 10,000 Services, and most of a restart's
// peak memory).
//
// A dump that sent an element twice is repeated: the kernel resumes each
// round of a hash set's dump by skipping as many elements as it already
// sent, and when the table was resized in between (the kernel grows it
// after a big insert, without a transaction, so without NLM_F_DUMP_INTR)
// the skipped ones are not those sent: some come twice, as many others
// never.
func (d *dumper) setElementIDs(sets []string) (map[string]map[string]uint32, error) {
	out := make(map[string]map[string]uint32, len(sets))
	for _, set := range sets {
		var ids map[string]uint32
		sent := 0
		err := d.dump(unix.NFT_MSG_GETSETELEM, unix.NFTA_SET_ELEM_LIST_TABLE, unix.NFTA_SET_ELEM_LIST_SET, set, func() { ids, sent = map[string]uint32{}, 0 }, func(msg []byte) {
			elementIDs(msg, func(id []byte) { ids[string(id)] = 1; sent++ })
		}, func() bool { return sent == len(ids) })
		if err != nil {
			return nil, fmt.Errorf("listing the elements of set %s: %w", set, err)
		}
		out[set] = ids
	}
	return out, nil
}

// errDumpInterrupted: the table changed during a dump, whose result is
// then inconsistent. errDumpDuplicates: a dump sent an element twice (so
// missed another), as when the kernel resized the set's hash table during it.
var (
	errDumpInterrupted = errors.New("dump interrupted by a change")
	errDumpDuplicates  = errors.New("dump sent an element twice (the set's hash table was resized meanwhile)")
)

const dumpTries = 10

// dump lists the objects of one chain or set (name, under attribute
// nameAttr) of the table, calling each with every message's attributes.
// An interrupted dump (any nftables change in the namespace meanwhile, the
// CNI's included), or one that whole (if given) finds inconsistent, is
// repeated after start, up to dumpTries times in all.
//
// Replies are read into a 64 KiB buffer, not with mdlayher/netlink, which
// reads a page: the kernel sizes a dump's next message by the largest read
// so far (up to 32 KiB), and an nftables set dump starts every message by
// walking past the elements already sent, so page-sized messages made
// reading a 100,000-element set back eight times slower.
func (d *dumper) dump(msgType, tableAttr, nameAttr uint16, name string, start func(), each func(attrs []byte), whole func() bool) error {
	data := appendString(append([]byte(nil), byte(d.table.Family), unix.NFNETLINK_V0, 0, 0), tableAttr, d.table.Name)
	req := netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | msgType), Flags: netlink.Request | netlink.Dump},
		Data:   appendString(data, nameAttr, name),
	}
	for try := 1; ; try++ {
		start()
		err := d.once(req, each)
		if err == nil && whole != nil && !whole() {
			err = errDumpDuplicates
		}
		if !errors.Is(err, errDumpInterrupted) && !errors.Is(err, errDumpDuplicates) || try == dumpTries {
			return err
		}
		if errors.Is(err, errDumpDuplicates) {
			time.Sleep(time.Duration(try) * time.Millisecond) // the kernel resizes in the background
		}
	}
}

func (d *dumper) once(req netlink.Message, each func(attrs []byte)) error {
	sent, err := d.c.Send(req)
	if err != nil {
		return err
	}
	raw, err := d.c.SyscallConn()
	if err != nil {
		return err
	}
	interrupted := false
	for {
		var n int
		var rerr error
		if err := raw.Read(func(fd uintptr) bool {
			for {
				n, _, rerr = unix.Recvfrom(int(fd), d.buf, unix.MSG_TRUNC)
				if rerr != unix.EINTR {
					return rerr != unix.EAGAIN
				}
			}
		}); err != nil {
			return err
		}
		if rerr != nil {
			return rerr
		}
		if n > len(d.buf) {
			return fmt.Errorf("a %d-byte dump message does not fit %d bytes", n, len(d.buf))
		}
		msgs, err := syscall.ParseNetlinkMessage(d.buf[:n])
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Header.Seq != sent.Header.Sequence {
				continue // a late answer to something else
			}
			interrupted = interrupted || m.Header.Flags&unix.NLM_F_DUMP_INTR != 0
			// DONE and ERROR carry an error code: a set deleted or a walk
			// failing in the middle of the dump ends it with DONE and
			// an error, and what came before is not the whole set.
			var code int32
			if len(m.Data) >= 4 {
				code = int32(binary.NativeEndian.Uint32(m.Data))
			}
			switch {
			case (m.Header.Type == unix.NLMSG_DONE || m.Header.Type == unix.NLMSG_ERROR) && code < 0:
				return syscall.Errno(-code)
			case m.Header.Type == unix.NLMSG_DONE && interrupted:
				return errDumpInterrupted
			case m.Header.Type == unix.NLMSG_DONE:
				return nil
			case m.Header.Type < unix.NLMSG_MIN_TYPE:
				continue // an acknowledgement, NOOP or OVERRUN
			}
			if len(m.Data) >= 4 {
				each(m.Data[4:])
			}
		}
	}
}

// readBack lists the table, its chains with rule fingerprints, its sets
// with their elements. Dynamic sets' elements are the kernel's own.
func (k *netlinkKernel) readBack(id TableID) (*kernelTable, error) {
	tables, err := k.conn.ListTablesOfFamily(id.Family)
	if err != nil {
		return nil, err
	}
	if !slices.ContainsFunc(tables, func(t *nftables.Table) bool { return t.Name == id.Name }) {
		return nil, nil // no table: it is created
	}
	chains, err := k.conn.ListChainsOfTableFamily(id.Family)
	if err != nil {
		return nil, err
	}
	chains = slices.DeleteFunc(chains, func(c *nftables.Chain) bool { return c.Table.Name != id.Name })
	names := make([]string, len(chains))
	for i, c := range chains {
		names[i] = c.Name
	}
	dump, err := k.dialer.dumper(id)
	if err != nil {
		return nil, err
	}
	defer dump.close()
	fps, err := dump.ruleFingerprints(names)
	if err != nil {
		return nil, err
	}
	kt := newKernelTable()
	for _, c := range chains {
		kc := &kernelChain{rules: fps[c.Name]}
		if c.Hooknum != nil && c.Priority != nil && c.Type != "" {
			kc.base = &Hook{Type: c.Type, Hook: *c.Hooknum, Priority: int32(*c.Priority)}
		}
		kt.chains[c.Name] = kc
	}
	sets, err := k.conn.GetSets(k.table)
	if err != nil {
		return nil, err
	}
	for _, s := range sets {
		if s.Anonymous || strings.HasPrefix(s.Name, "__") {
			continue
		}
		ks := &kernelSet{spec: SetSpec{Dynamic: s.Dynamic, Timeout: s.Timeout}, name: s.Name, size: s.Size}
		if s.IsMap {
			// The library reports a verdict map's data type as its key
			// type and leaves DataType empty; a data map's is decoded.
			ks.spec.Data = s.DataType
			if ks.spec.Data.Name == "" {
				ks.spec.Data = nftables.TypeVerdict
			}
		}
		kt.addReadSet(ks)
	}
	var static []string
	for _, ks := range kt.sets {
		if !ks.spec.Dynamic {
			static = append(static, ks.name)
		}
	}
	byName, err := dump.setElementIDs(static)
	if err != nil {
		return nil, err
	}
	for kname, ids := range byName {
		kt.sets[logicalName(kname)].elems = elems{m: ids}
	}
	return kt, nil
}

// addReadSet records a set read back. When a desired set is found under
// two names (a replacement cut short), the bigger is kept (it can take what
// either held), every chain reading either is rewritten to read it, and the
// other goes.
func (k *kernelTable) addReadSet(ks *kernelSet) {
	name := logicalName(ks.name)
	if other := k.sets[name]; other != nil {
		if capacity(other.size) >= capacity(ks.size) {
			ks, other = other, ks
		}
		k.extra = append(k.extra, other.name)
	}
	k.sets[name] = ks
}

// reread reads back into kt the rules of the chains and the elements of
// the sets that f names, of those kt holds: what others changed, when
// they changed nothing else. A chain or set that others made or deleted
// is more than that (f.all), and reads the whole table back instead.
func (k *netlinkKernel) reread(id TableID, kt *kernelTable, f *foreign) (int, error) {
	var chains, sets []string
	for name := range f.chains {
		if kt.chains[name] != nil {
			chains = append(chains, name)
		}
	}
	byKernel := map[string]*kernelSet{}
	for _, ks := range kt.sets {
		if f.sets[ks.name] && !ks.spec.Dynamic {
			byKernel[ks.name] = ks
			sets = append(sets, ks.name)
		}
	}
	if len(chains)+len(sets) == 0 {
		return 0, nil
	}
	dump, err := k.dialer.dumper(id)
	if err != nil {
		return 0, err
	}
	defer dump.close()
	fps, err := dump.ruleFingerprints(chains)
	if err != nil {
		return 0, err
	}
	ids, err := dump.setElementIDs(sets)
	if err != nil {
		return 0, err
	}
	for name, rules := range fps {
		kt.chains[name].rules = rules
	}
	for kname, m := range ids {
		byKernel[kname].elems = elems{m: m} // the adopted ones stay the desired set's
	}
	return len(chains) + len(sets), nil
}
