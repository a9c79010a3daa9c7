package proxy

import (
	"encoding/binary"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
)

// appendElements encodes the attributes of a NEWSETELEM or DELSETELEM
// message for the elements ids (Element.id) of the named set or map set of
// table: what google/nftables' SetAddElements sends, without its buffers
// per element. Named sets here have no intervals, timeouts or comments.
func appendElements(b []byte, table, set string, spec SetSpec, ids []string) []byte {
	b = appendString(b, unix.NFTA_SET_ELEM_LIST_TABLE, table)
	b = appendString(b, unix.NFTA_SET_ELEM_LIST_SET, set)
	list := beginNest(&b, unix.NFTA_SET_ELEM_LIST_ELEMENTS)
	verdicts := spec.Data.Name == nftables.TypeVerdict.Name
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
		case spec.isMap():
			d := beginNest(&b, unix.NFTA_SET_ELEM_DATA)
			b = appendAttr(b, unix.NFTA_DATA_VALUE, rest)
			endNest(b, d)
		}
		endNest(b, elem)
	}
	endNest(b, list)
	return b
}

// appendAttr appends a netlink attribute holding data, padded to 4 bytes.
func appendAttr(b []byte, typ uint16, data string) []byte {
	b = binary.NativeEndian.AppendUint16(b, uint16(unix.NLA_HDRLEN+len(data)))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, data...)
	return append(b, make([]byte, pad4(len(data)))...)
}

// appendString appends a NUL-terminated string attribute.
func appendString(b []byte, typ uint16, s string) []byte {
	b = binary.NativeEndian.AppendUint16(b, uint16(unix.NLA_HDRLEN+len(s)+1))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, s...)
	return append(b, make([]byte, 1+pad4(len(s)+1))...)
}

func pad4(n int) int { return (4 - n%4) % 4 }

// beginNest starts a nested attribute; endNest sets its length.
func beginNest(b *[]byte, typ uint16) int {
	at := len(*b)
	*b = binary.NativeEndian.AppendUint16(*b, 0)
	*b = binary.NativeEndian.AppendUint16(*b, typ|unix.NLA_F_NESTED)
	return at
}

func endNest(b []byte, at int) {
	binary.NativeEndian.PutUint16(b[at:], uint16(len(b)-at))
}
