package proxy

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/netplane/netplane/nft"
)

// This file holds the statements only a Service proxy needs, built on the
// nft package's rule builder: the choice of an endpoint from the shared
// endpoint maps, and the element ids of those maps and of the hairpin set.

// masqBit marks packets for masquerade in postrouting (kube-proxy's default
// masquerade bit 14). The mark is not an API: other software must not rely on it.
const masqBit = 0x4000

// slotKey is a Service's part of its endpoints' keys in the shared maps:
// ClusterIP . protocol . port.
type slotKey struct {
	cip   netip.Addr
	proto uint8
	port  uint16
}

func newSlotKey(cip netip.Addr, proto uint8, p uint16) slotKey { return slotKey{cip, proto, p} }

// elemID is the id of the endpoint map's element mapping slot i of the
// Service to ep: ClusterIP . protocol . port . slot (a mark, as numgen
// writes it in host byte order) → address . port. It is built in place, in
// one allocation: a full build makes one per endpoint.
func (k slotKey) elemID(i uint32, ep netip.AddrPort) string {
	var buf [nft.MaxIDLen]byte
	return nft.NewID(buf[:0]).Addr(k.cip).Proto(k.proto).Port(k.port).Uint32(i).EndKey().
		Addr(ep.Addr()).Port(ep.Port()).String()
}

// hairpinID is the hairpin set's element for a: a . a.
func hairpinID(a netip.Addr) string {
	var buf [nft.MaxIDLen]byte
	return nft.NewID(buf[:0]).Addr(a).Addr(a).String()
}

func (k slotKey) text() string {
	return fmt.Sprintf("%s . %s . %d", k.cip, nft.ProtoName(k.proto), k.port)
}

// dnatSlot: "dnat to 10.96.0.1 . tcp . 80 . numgen random mod N offset O
// map @set". One immediate per field at the field's own length (the kernel
// zero-pads the register); `nft list` shows them in hex all the same, as
// it has no type for constants in a concatenation.
func dnatSlot(r *nft.RuleBuilder, k slotKey, n int, offset uint32, set string) *nft.RuleBuilder {
	text := fmt.Sprintf("dnat %s to %s . numgen random mod %d", r.IPWord(), k.text(), n)
	if offset != 0 {
		text += fmt.Sprintf(" offset %d", offset)
	}
	addr := k.cip.AsSlice()
	a := nft.Reg + uint32(len(addr))/4
	return r.Add(text+" map @"+set,
		&expr.Immediate{Register: nft.Reg, Data: addr},
		&expr.Immediate{Register: a, Data: []byte{k.proto}},
		&expr.Immediate{Register: a + 1, Data: binary.BigEndian.AppendUint16(nil, k.port)},
		&expr.Numgen{Register: a + 2, Modulus: uint32(n), Offset: offset, Type: unix.NFT_NG_RANDOM},
		&expr.Lookup{SourceRegister: nft.Reg, SetName: set, IsDestRegSet: true, DestRegister: nft.Reg},
		r.NAT())
}

// serviceFields are a packet's Service: the key of the dispatch maps, and
// the first part of the endpoint maps' keys.
var serviceFields = []nft.Field{nft.Daddr, nft.L4Proto, nft.THDport}

// dnatPick: "dnat ip to ip daddr . meta l4proto . th dport . numgen random
// mod N map @set". The Service's part of the key comes from the packet,
// not from immediates: only traffic to a ClusterIP comes here, so one
// chain serves every pooled Service with N endpoints.
func dnatPick(r *nft.RuleBuilder, n int, set string) *nft.RuleBuilder {
	return r.Add(fmt.Sprintf("dnat %s to %s . numgen random mod %d map @%s", r.IPWord(), r.FieldsText(serviceFields...), n, set),
		append(r.Load(serviceFields...),
			&expr.Numgen{Register: nft.Reg + r.AddrLen()/4 + 2, Modulus: uint32(n), Type: unix.NFT_NG_RANDOM},
			&expr.Lookup{SourceRegister: nft.Reg, SetName: set, IsDestRegSet: true, DestRegister: nft.Reg},
			r.NAT())...)
}
