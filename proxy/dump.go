package proxy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Dialer opens netlink sockets in one network namespace.
type Dialer struct {
	// NetNS is a file descriptor of the namespace; 0 means the caller's.
	NetNS int
}

// dumper lists objects of the family's table over a socket of its own,
// for one read-back; close it after.
type dumper struct {
	c   *netlink.Conn
	fam nftables.TableFamily
	buf []byte
}

func (d Dialer) dumper(fam nftables.TableFamily) (*dumper, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: d.NetNS})
	if err != nil {
		return nil, err
	}
	if err := bigBuffers(c); err != nil {
		c.Close()
		return nil, err
	}
	return &dumper{c: c, fam: fam, buf: make([]byte, 64<<10)}, nil
}

func (d *dumper) close() { d.c.Close() }

// ruleFingerprints lists the fingerprints of the rules of the family's
// table, by chain and in order: one netlink dump per chain. Expressions are
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

// setElementIDs lists the elements of the family's named sets (none
// dynamic), as ids (Element.id) by set. They are decoded from the kernel's
// messages as they arrive: google/nftables builds every element of a set,
// with several buffers each, before returning them (300 MB of garbage to
// adopt the 220,000 elements of 10,000 Services, and most of a restart's
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
	data := appendString(append([]byte(nil), byte(d.fam), unix.NFNETLINK_V0, 0, 0), tableAttr, TableName)
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

// elementIDs calls add with the id of each element in the attributes of a
// NEWSETELEM message: the key's length and bytes, then the data's bytes or
// the verdict's code and chain, as Element.id has them. id is reused.
func elementIDs(msg []byte, add func(id []byte)) {
	var id []byte
	eachAttr(msg, func(typ uint16, list []byte) {
		if typ != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
			return
		}
		eachAttr(list, func(_ uint16, elem []byte) {
			var key, data, code, chain []byte
			eachAttr(elem, func(typ uint16, b []byte) {
				switch typ {
				case unix.NFTA_SET_ELEM_KEY:
					key = value(b, unix.NFTA_DATA_VALUE)
				case unix.NFTA_SET_ELEM_DATA:
					data = value(b, unix.NFTA_DATA_VALUE)
					v := value(b, unix.NFTA_DATA_VERDICT)
					code, chain = value(v, unix.NFTA_VERDICT_CODE), value(v, unix.NFTA_VERDICT_CHAIN)
				}
			})
			if key == nil || len(key) > 255 {
				return
			}
			id = append(append(id[:0], byte(len(key))), key...)
			if len(code) == 4 {
				for len(chain) > 0 && chain[len(chain)-1] == 0 {
					chain = chain[:len(chain)-1] // the NUL ending a string attribute
				}
				id = append(append(id, code...), chain...)
			} else {
				id = append(id, data...)
			}
			add(id)
		})
	})
}

// value is the payload of the first attribute of type typ in b, or nil.
func value(b []byte, typ uint16) []byte {
	var out []byte
	eachAttr(b, func(t uint16, data []byte) {
		if t == typ && out == nil {
			out = data
		}
	})
	return out
}

// eachAttr calls fn with the type (without the nested and byte-order flags)
// and the payload of each netlink attribute in b, stopping at a malformed
// one. Decoding in place costs no allocation per element.
func eachAttr(b []byte, fn func(typ uint16, data []byte)) {
	for len(b) >= unix.NLA_HDRLEN {
		n := int(binary.NativeEndian.Uint16(b))
		if n < unix.NLA_HDRLEN || n > len(b) {
			return
		}
		fn(binary.NativeEndian.Uint16(b[2:])&^(unix.NLA_F_NESTED|unix.NLA_F_NET_BYTEORDER), b[unix.NLA_HDRLEN:n])
		b = b[min(len(b), n+pad4(n)):]
	}
}
