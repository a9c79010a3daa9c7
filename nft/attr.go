package nft

import (
	"encoding/binary"

	"golang.org/x/sys/unix"
)

// Netlink messages and attributes, encoded into and decoded from byte
// slices in place: the messages of this package's own (set elements, the
// transaction's frame) and the answers of its dumps cost no allocation per
// attribute.

func appendHeader(b []byte, size int, typ, flags uint16, seq uint32) []byte {
	b = binary.NativeEndian.AppendUint32(b, uint32(size))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = binary.NativeEndian.AppendUint16(b, flags)
	b = binary.NativeEndian.AppendUint32(b, seq)
	return binary.NativeEndian.AppendUint32(b, 0) // port: the kernel's
}

// setFlag sets a flag in the header of the message msg starts with.
func setFlag(msg []byte, flag uint16) {
	binary.NativeEndian.PutUint16(msg[6:], binary.NativeEndian.Uint16(msg[6:])|flag)
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
