package nft

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// netlinkKernel is one table of a namespace's nftables, reached over
// netlink: the kernel a Programmer converges. It sends a plan's steps as
// messages, chains and rules encoded by google/nftables, set elements by
// this package (element.go).
type netlinkKernel struct {
	dialer Dialer
	id     TableID
	table  *nftables.Table
	conn   *nftables.Conn // reads; nil until dialled, and after a failure
	writer *batchWriter   // writes; dialled with conn
	// mon reports changes by others, shared with the namespace's other
	// programmers.
	mon *monitor
}

var _ txWriter = (*netlinkKernel)(nil)

// rcvBuf sizes the netlink sockets' buffers: a dump of a big table is read
// in large chunks, and a whole transaction goes out in one sendmsg.
const rcvBuf = 16 << 20

// bigBuffers sizes a netlink socket's buffers for a whole transaction.
func bigBuffers(c *netlink.Conn) error { return forceBuffers(c, rcvBuf, rcvBuf) }

// forceBuffers sets a netlink socket's receive and send buffer sizes (0:
// unchanged). FORCE ignores net.core.rmem_max; it needs CAP_NET_ADMIN,
// which programming nftables needs anyway.
func forceBuffers(c *netlink.Conn, rcv, snd int) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var errs []error
	if err := raw.Control(func(fd uintptr) {
		if rcv > 0 {
			errs = append(errs, unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, rcv))
		}
		if snd > 0 {
			errs = append(errs, unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, snd))
		}
	}); err != nil {
		return err
	}
	return errors.Join(errs...)
}

func (k *netlinkKernel) connect() (bool, error) {
	fresh := false
	if k.conn == nil {
		c, w, err := k.dial()
		if err != nil {
			return false, err
		}
		k.conn, k.writer, fresh = c, w, true
	}
	// Listening before the read-back, so nothing falls in between; draining
	// before it also clears what it makes obsolete.
	k.mon.open()
	return fresh, nil
}

// dial opens the lasting nftables connection the programmer reads with and
// the writer it sends with.
func (k *netlinkKernel) dial() (*nftables.Conn, *batchWriter, error) {
	opts := []nftables.ConnOption{nftables.AsLasting(), nftables.WithSockOptions(bigBuffers)}
	if k.dialer.NetNS != 0 {
		opts = append(opts, nftables.WithNetNSFd(k.dialer.NetNS))
	}
	c, err := nftables.New(opts...)
	if err != nil {
		return nil, nil, err
	}
	w, err := newBatchWriter(k.dialer)
	if err != nil {
		_ = c.CloseLasting()
		return nil, nil, err
	}
	w.leadWith(k.id.Family, k.id.Name)
	if k.table == nil {
		k.table = &nftables.Table{Name: k.id.Name, Family: k.id.Family}
	}
	return c, w, nil
}

func (k *netlinkKernel) changed(t TableID) *foreign { return k.mon.changed(t) }

// send sends the plan with the monitor away from the multicast group.
func (k *netlinkKernel) send(p *plan) (Stats, error) {
	if len(p.steps) == 0 {
		return p.send(k)
	}
	var st Stats
	err := k.mon.away(k.writer, func() (err error) {
		st, err = p.send(k)
		return err
	})
	return st, err
}

func (k *netlinkKernel) reset() {
	if k.conn != nil {
		_ = k.conn.CloseLasting()
		k.conn = nil
	}
	if k.writer != nil {
		k.writer.Close()
		k.writer = nil
	}
}

func (k *netlinkKernel) close() {
	k.reset()
	k.mon.Close()
}

func (k *netlinkKernel) discard()     { k.writer.Discard() }
func (k *netlinkKernel) queue() error { return k.writer.Queue() }
func (k *netlinkKernel) wait() error  { return k.writer.Wait() }

// add encodes a step into the transaction.
func (k *netlinkKernel) add(p *plan, s *step) error {
	t, w := k.table, k.writer
	if s.op == opElements {
		typ := uint16(unix.NFT_MSG_NEWSETELEM)
		if s.del {
			typ = unix.NFT_MSG_DELSETELEM
		}
		w.beginOwn(typ, t.Family)
		w.ownB = appendElements(w.ownB, t.Name, s.name, *s.spec, s.ids)
		w.endOwn()
		return nil
	}
	c := w.library()
	switch s.op {
	case opAddTable:
		c.AddTable(t)
	case opDelTable:
		c.DelTable(t)
	case opAddSet:
		return c.AddSet(namedSet(t, s.name, *s.spec, s.size), nil)
	case opAddChain:
		c.AddChain(libChain(t, s.chain))
	case opRewrite:
		ch := libChain(t, s.chain)
		if s.rebase {
			c.DelChain(ch) // a hook or priority someone changed
			c.AddChain(ch)
		} else if s.flush {
			c.FlushChain(ch)
		}
		for _, rl := range s.chain.Rules {
			if err := addRule(c, ch, rl, p.names); err != nil {
				return fmt.Errorf("chain %s: %w", s.chain.Name, err)
			}
		}
	case opFlushChain:
		c.FlushChain(&nftables.Chain{Table: t, Name: s.name})
	case opDelSet:
		c.DelSet(&nftables.Set{Table: t, Name: s.name})
	case opDelChain:
		c.DelChain(&nftables.Chain{Table: t, Name: s.name})
	}
	return nil
}

func libChain(t *nftables.Table, ch *Chain) *nftables.Chain {
	c := &nftables.Chain{Name: ch.Name, Table: t}
	if ch.Base != nil {
		c.Type = ch.Base.Type
		c.Hooknum = &ch.Base.Hook
		prio := nftables.ChainPriority(ch.Base.Priority)
		c.Priority = &prio
	}
	return c
}

// namedSet is a set of spec as the kernel's set kname of size (0:
// resizable).
func namedSet(t *nftables.Table, kname string, spec SetSpec, size uint32) *nftables.Set {
	ns := &nftables.Set{
		Table:         t,
		Name:          kname,
		Size:          size,
		KeyType:       spec.Key,
		DataType:      spec.Data,
		IsMap:         spec.IsMap(),
		Concatenation: strings.Contains(spec.Key.Name, " . "),
	}
	if spec.Dynamic {
		ns.Dynamic, ns.HasTimeout, ns.Timeout = true, true, spec.Timeout
	}
	return ns
}

// addRule adds one rule, reading the sets of names under their kernel
// names, first creating its anonymous set if it has one.
func addRule(c *nftables.Conn, ch *nftables.Chain, rl Rule, names map[string]string) error {
	exprs := renamed(rl.Exprs, names)
	if rl.Anon != nil {
		set := &nftables.Set{
			Table: ch.Table, Anonymous: true, Constant: true,
			KeyType: rl.Anon.Key, DataType: rl.Anon.Data, IsMap: rl.Anon.Data.Name != "",
			Interval: rl.Anon.Interval,
		}
		set.ID, set.Name = anonSetNames.next(set.IsMap)
		if err := c.AddSet(set, rl.Anon.Elements); err != nil {
			return err
		}
		named := exprs
		exprs = make([]expr.Any, len(named))
		for i, e := range named {
			if l, ok := e.(*expr.Lookup); ok && l.SetName == AnonSetName {
				l2 := *l
				l2.SetName, l2.SetID = set.Name, set.ID
				e = &l2
			}
			exprs[i] = e
		}
	}
	c.AddRule(&nftables.Rule{Table: ch.Table, Chain: ch, Exprs: exprs,
		UserData: userdata.AppendString(nil, userdata.TypeComment, rl.FP)})
	return nil
}

// anonSetNames names anonymous sets. Left to the kernel ("__set%d"), each
// new name costs a scan of every set in the table with sscanf, which makes
// programming the rules of 10,000 Services quadratic (seconds); a name of
// our own costs one strcmp per set. The random part keeps names unique
// across restarts (sets of an earlier process stay in the kernel); IDs
// start high so they never meet the library's own transaction IDs.
var anonSetNames = newAnonNamer()

type anonNamer struct {
	mu    sync.Mutex
	nonce string
	id    uint32
}

func newAnonNamer() *anonNamer {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return &anonNamer{nonce: hex.EncodeToString(b[:]), id: 1 << 30}
}

func (a *anonNamer) next(isMap bool) (uint32, string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.id++
	prefix := "__set"
	if isMap {
		prefix = "__map"
	}
	return a.id, prefix + a.nonce + strconv.FormatUint(uint64(a.id), 36)
}
