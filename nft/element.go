package nft

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// This file is the element-id codec, the one place that knows its bytes.
// An element of a named set or map is kept as an id: the key's length, the
// key, then the data or the verdict's code (4 bytes, big endian) and chain,
// as raw bytes in a string. The id includes the value, so a changed value is
// a delete of the old element and an add of the new; the key is a prefix of
// the id (ElementKey), which is how a changed value is told from a new key.
// Ids are made for every element of every build and read-back (100,000 at
// 10,000 Services), so making one costs one allocation, and the kernel's
// messages are encoded from ids and decoded into ids without a value per
// element in between.

// Element is one element of a named set or map, as its fields.
type Element struct {
	Key     []byte
	Val     []byte
	Verdict *expr.Verdict
}

// ID is the element's id.
func (e Element) ID() string {
	n := 1 + len(e.Key) + len(e.Val)
	if e.Verdict != nil {
		n += 4 + len(e.Verdict.Chain)
	}
	b := make([]byte, 0, n)
	b = append(b, byte(len(e.Key)))
	b = append(b, e.Key...)
	if e.Verdict != nil {
		b = binary.BigEndian.AppendUint32(b, uint32(e.Verdict.Kind))
		b = append(b, e.Verdict.Chain...)
	} else {
		b = append(b, e.Val...)
	}
	return string(b)
}

// MaxIDLen holds the id of any element of an address, protocol, port and
// 32-bit key mapped to an address and port, IPv6 included: a buffer of it
// lets IDBuilder build such an id without allocating.
const MaxIDLen = 64

// MaxVerdictIDLen holds the id of such a key mapped to a verdict: a chain's
// name is at most 256 bytes.
const MaxVerdictIDLen = MaxIDLen + 256

// IDBuilder builds an id field by field in a buffer its caller owns (an
// array on the stack), so an id built on a hot path costs only its string:
//
//	var buf [nft.MaxIDLen]byte
//	id := nft.NewID(buf[:0]).Addr(vip).Proto(6).Port(80).EndKey().Addr(ep).Port(8080).String()
//
// Fields are laid out as in the kernel's registers, each padded to 4 bytes,
// which is what a concatenation of nftables types expects. Fields after
// EndKey are the value; a set's element has none.
type IDBuilder struct{ b []byte }

// NewID starts an id in buf (its length is ignored).
func NewID(buf []byte) IDBuilder { return IDBuilder{append(buf[:0], 0)} }

// Addr appends an address: 4 or 16 bytes.
func (w IDBuilder) Addr(a netip.Addr) IDBuilder {
	if a.Is4() {
		v := a.As4()
		w.b = append(w.b, v[:]...)
		return w
	}
	v := a.As16()
	w.b = append(w.b, v[:]...)
	return w
}

// Proto appends an inet_proto field.
func (w IDBuilder) Proto(p uint8) IDBuilder {
	w.b = append(w.b, p, 0, 0, 0)
	return w
}

// Port appends an inet_service field: big endian.
func (w IDBuilder) Port(p uint16) IDBuilder {
	w.b = append(w.b, byte(p>>8), byte(p), 0, 0)
	return w
}

// Uint32 appends a 32-bit field in host byte order, as marks and numgen's
// results are.
func (w IDBuilder) Uint32(v uint32) IDBuilder {
	w.b = binary.NativeEndian.AppendUint32(w.b, v)
	return w
}

// EndKey ends the key: what follows is the value.
func (w IDBuilder) EndKey() IDBuilder {
	w.b[0] = byte(len(w.b) - 1)
	return w
}

// Verdict appends a verdict value (after EndKey).
func (w IDBuilder) Verdict(kind expr.VerdictKind, chain string) IDBuilder {
	w.b = binary.BigEndian.AppendUint32(w.b, uint32(kind))
	w.b = append(w.b, chain...)
	return w
}

// String is the id, its key ended if EndKey was not called.
func (w IDBuilder) String() string {
	if w.b[0] == 0 {
		w = w.EndKey()
	}
	return string(w.b)
}

// Bytes is the id in the caller's buffer, its key ended if EndKey was not
// called: valid until the buffer is written again.
func (w IDBuilder) Bytes() []byte {
	if w.b[0] == 0 {
		w = w.EndKey()
	}
	return w.b
}

// ElementKey is the key part of an element id.
func ElementKey(id string) string { return id[:1+int(id[0])] }

// DecodeElement is the element an id of a set of spec stands for.
func DecodeElement(id string, spec SetSpec) nftables.SetElement {
	n := int(id[0])
	e := nftables.SetElement{Key: []byte(id[1 : 1+n])}
	rest := id[1+n:]
	switch {
	case spec.isVerdictMap() && len(rest) >= 4:
		e.VerdictData = &expr.Verdict{Kind: expr.VerdictKind(int32(binary.BigEndian.Uint32([]byte(rest[:4])))), Chain: rest[4:]}
	case spec.IsMap():
		e.Val = []byte(rest)
	}
	return e
}

// ElementText is an element as nft prints it: the key's fields by the
// set's types, then the data or verdict.
func ElementText(id string, spec SetSpec) string {
	e := DecodeElement(id, spec)
	text := fieldsText(e.Key, spec.Key)
	switch {
	case e.VerdictData != nil:
		text += " : " + verdictText(e.VerdictData)
	case spec.IsMap():
		text += " : " + fieldsText(e.Val, spec.Data)
	}
	return text
}

// fieldsText prints the fields of a key or value of type typ.
func fieldsText(b []byte, typ nftables.SetDatatype) string {
	var parts []string
	for _, t := range nftables.ConcatSetTypeElements(typ) {
		w := (int(t.Bytes) + 3) &^ 3 // fields are padded to registers
		if w > len(b) {
			break
		}
		switch t.Name {
		case nftables.TypeIPAddr.Name, nftables.TypeIP6Addr.Name:
			a, _ := netip.AddrFromSlice(b[:t.Bytes])
			parts = append(parts, a.String())
		case nftables.TypeInetProto.Name:
			parts = append(parts, ProtoName(b[0]))
		case nftables.TypeInetService.Name:
			parts = append(parts, strconv.Itoa(int(binary.BigEndian.Uint16(b[:2]))))
		case nftables.TypeMark.Name:
			parts = append(parts, strconv.FormatUint(uint64(binary.NativeEndian.Uint32(b[:4])), 10))
		default:
			parts = append(parts, fmt.Sprintf("0x%x", b[:t.Bytes]))
		}
		b = b[w:]
	}
	return strings.Join(parts, " . ")
}

// verdictText is a verdict as nft prints it.
func verdictText(v *expr.Verdict) string {
	switch v.Kind {
	case expr.VerdictDrop:
		return "drop"
	case expr.VerdictAccept:
		return "accept"
	case expr.VerdictReturn:
		return "return"
	case expr.VerdictContinue:
		return "continue"
	case expr.VerdictJump:
		return "jump " + v.Chain
	case expr.VerdictGoto:
		return "goto " + v.Chain
	}
	return fmt.Sprintf("verdict %d", v.Kind)
}

// ProtoName is a transport protocol as nft names it.
func ProtoName(p uint8) string {
	switch p {
	case unix.IPPROTO_TCP:
		return "tcp"
	case unix.IPPROTO_UDP:
		return "udp"
	case unix.IPPROTO_SCTP:
		return "sctp"
	case unix.IPPROTO_ICMP:
		return "icmp"
	case unix.IPPROTO_ICMPV6:
		return "ipv6-icmp"
	}
	return strconv.Itoa(int(p))
}

// appendElements encodes the attributes of a NEWSETELEM or DELSETELEM
// message for the elements ids of the named set or map set of table: what
// google/nftables' SetAddElements sends, without its buffers per element.
// Named sets here have no intervals, timeouts or comments.
func appendElements(b []byte, table, set string, spec SetSpec, ids []string) []byte {
	b = appendString(b, unix.NFTA_SET_ELEM_LIST_TABLE, table)
	b = appendString(b, unix.NFTA_SET_ELEM_LIST_SET, set)
	list := beginNest(&b, unix.NFTA_SET_ELEM_LIST_ELEMENTS)
	verdicts := spec.isVerdictMap()
	for i, id := range ids {
		n := 1 + int(id[0])
		key, rest := id[1:n], id[n:]
		elem := beginNest(&b, uint16(i+1))
		k := beginNest(&b, unix.NFTA_SET_ELEM_KEY)
		b = appendAttr(b, unix.NFTA_DATA_VALUE, key)
		endNest(b, k)
		switch {
		case verdicts && len(rest) >= 4:
			d := beginNest(&b, unix.NFTA_SET_ELEM_DATA)
			v := beginNest(&b, unix.NFTA_DATA_VERDICT)
			b = appendAttr(b, unix.NFTA_VERDICT_CODE, rest[:4])
			if chain := rest[4:]; chain != "" {
				b = appendString(b, unix.NFTA_VERDICT_CHAIN, chain)
			}
			endNest(b, v)
			endNest(b, d)
		case spec.IsMap():
			d := beginNest(&b, unix.NFTA_SET_ELEM_DATA)
			b = appendAttr(b, unix.NFTA_DATA_VALUE, rest)
			endNest(b, d)
		}
		endNest(b, elem)
	}
	endNest(b, list)
	return b
}

// elementIDs calls add with the id of each element in the attributes of a
// NEWSETELEM message (a dump's answer). id is reused.
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
