package proxy

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// This file turns the handful of statements netplane uses into both nft text
// and kernel expressions, so the two can never disagree. Registers are
// numbered as 32-bit registers (unix.NFT_REG32_00 upward) throughout, which
// is what concatenations need.

const reg = unix.NFT_REG32_00

// masqBit marks packets for masquerade in postrouting (kube-proxy's default
// masquerade bit 14). The mark is not an API: other software must not rely on it.
const masqBit = 0x4000

// rule accumulates statements into a Rule.
type rule struct {
	fam   nftables.TableFamily
	text  []string
	exprs []expr.Any
	anon  *AnonSet
}

func newRule(fam nftables.TableFamily) *rule { return &rule{fam: fam} }

func (r *rule) add(text string, e ...expr.Any) *rule {
	r.text = append(r.text, text)
	r.exprs = append(r.exprs, e...)
	return r
}

func (r *rule) done() Rule {
	text := strings.Join(r.text, " ")
	return Rule{Text: text, FP: fingerprint(text), Exprs: r.exprs, Anon: r.anon}
}

func (r *rule) v6() bool { return r.fam == nftables.TableFamilyIPv6 }

func (r *rule) ipWord() string {
	if r.v6() {
		return "ip6"
	}
	return "ip"
}

func (r *rule) addrLen() uint32 {
	if r.v6() {
		return 16
	}
	return 4
}

// addrLoad loads the source or destination address into register dst.
func (r *rule) addrLoad(field string, dst uint32) *expr.Payload {
	off := map[string]uint32{"saddr": 12, "daddr": 16}[field]
	if r.v6() {
		off = map[string]uint32{"saddr": 8, "daddr": 24}[field]
	}
	return &expr.Payload{DestRegister: dst, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: r.addrLen()}
}

// matchPrefix: "ip saddr 10.0.0.0/8", "ip daddr != 10.96.0.1".
func (r *rule) matchPrefix(field string, p netip.Prefix, neq bool) *rule {
	op, word := expr.CmpOpEq, ""
	if neq {
		op, word = expr.CmpOpNeq, "!= "
	}
	text := fmt.Sprintf("%s %s %s%s", r.ipWord(), field, word, prefixText(p))
	ex := []expr.Any{r.addrLoad(field, reg)}
	if p.Bits() < p.Addr().BitLen() {
		mask := netipMask(p)
		ex = append(ex, &expr.Bitwise{SourceRegister: reg, DestRegister: reg, Len: r.addrLen(), Mask: mask, Xor: make([]byte, len(mask))})
	}
	ex = append(ex, &expr.Cmp{Op: op, Register: reg, Data: p.Masked().Addr().AsSlice()})
	return r.add(text, ex...)
}

func prefixText(p netip.Prefix) string {
	if p.Bits() == p.Addr().BitLen() {
		return p.Addr().String()
	}
	return p.Masked().String()
}

func netipMask(p netip.Prefix) []byte {
	b := make([]byte, p.Addr().BitLen()/8)
	for i := 0; i < p.Bits(); i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	return b
}

// lookupAddr: "ip daddr @cluster-ips".
func (r *rule) lookupAddr(field, set string) *rule {
	return r.add(fmt.Sprintf("%s %s @%s", r.ipWord(), field, set),
		r.addrLoad(field, reg), &expr.Lookup{SourceRegister: reg, SetName: set})
}

// matchPrefixes: "ip saddr 10.0.0.0/8" for one prefix, "ip saddr != {
// 10.0.0.0/8, 172.16.0.0/12 }" (an anonymous interval set) for several.
func (r *rule) matchPrefixes(field string, prefixes []netip.Prefix, neq bool) *rule {
	if len(prefixes) == 1 {
		return r.matchPrefix(field, prefixes[0], neq)
	}
	return r.inAnon(field, prefixes, neq)
}

// notInAnon: "ip saddr != { 203.0.113.0/25, ... }".
func (r *rule) notInAnon(field string, prefixes []netip.Prefix) *rule {
	return r.inAnon(field, prefixes, true)
}

// inAnon: "ip daddr { 10.96.0.0/16, ... }", or with neq "!= { ... }". A
// rule holds at most one anonymous set.
func (r *rule) inAnon(field string, prefixes []netip.Prefix, neq bool) *rule {
	texts := make([]string, len(prefixes))
	for i, p := range prefixes {
		texts[i] = prefixText(p)
	}
	key := nftables.TypeIPAddr
	if r.v6() {
		key = nftables.TypeIP6Addr
	}
	op := ""
	if neq {
		op = "!= "
	}
	r.anon = &AnonSet{Key: key, Interval: true, Elements: intervalElements(prefixes)}
	return r.add(fmt.Sprintf("%s %s %s{ %s }", r.ipWord(), field, op, strings.Join(texts, ", ")),
		r.addrLoad(field, reg), &expr.Lookup{SourceRegister: reg, SetName: anonSetName, Invert: neq})
}

// ctStateNew: "ct state new".
func (r *rule) ctStateNew() *rule {
	return r.add("ct state new",
		&expr.Ct{Register: reg, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: reg, DestRegister: reg, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitNEW), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg, Data: make([]byte, 4)})
}

// Expressions are never modified once built, so the common ones are
// shared by every rule using them: at 10,000 Services there are over
// 100,000 endpoint rules, each with the same protocol match, NAT and, per
// endpoint count, the same numgen.
var (
	l4protoExprs = map[uint8][]expr.Any{}
	pickExprs    = map[int][]expr.Any{}
	natExprs     = map[nftables.TableFamily]*expr.NAT{}
)

func init() {
	for _, p := range []uint8{unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_SCTP} {
		l4protoExprs[p] = []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg},
			&expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: []byte{p}}}
	}
	for n := 2; n <= maxPickRules; n++ {
		pickExprs[n] = []expr.Any{
			&expr.Numgen{Register: reg, Modulus: uint32(n), Type: unix.NFT_NG_RANDOM},
			&expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: make([]byte, 4)}}
	}
	for _, f := range Families {
		fam := uint32(unix.NFPROTO_IPV4)
		if f == nftables.TableFamilyIPv6 {
			fam = unix.NFPROTO_IPV6
		}
		// The address in the first registers, the port in the next one.
		natExprs[f] = &expr.NAT{Type: expr.NATTypeDestNAT, Family: fam, RegAddrMin: reg, RegProtoMin: reg + newRule(f).addrLen()/4, Specified: true}
	}
}

// l4proto: "meta l4proto tcp" (p is one of protoNumber's).
func (r *rule) l4proto(p uint8) *rule {
	return r.add("meta l4proto "+protoName(p), l4protoExprs[p]...)
}

// fibSaddrLocal: "fib saddr type local" (the packet comes from this node).
func (r *rule) fibSaddrLocal() *rule {
	return r.add("fib saddr type local",
		&expr.Fib{Register: reg, FlagSADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)})
}

// vmapAddrProtoPort: "ip daddr . meta l4proto . th dport vmap @set".
func (r *rule) vmapAddrProtoPort(set string) *rule {
	return r.add(fmt.Sprintf("%s daddr . meta l4proto . th dport vmap @%s", r.ipWord(), set),
		append(r.addrProtoPort(),
			&expr.Lookup{SourceRegister: reg, SetName: set, IsDestRegSet: true, DestRegister: unix.NFT_REG_VERDICT})...)
}

// addrProtoPort loads "ip daddr . meta l4proto . th dport" from reg on:
// the Service's key in the dispatch maps and in the endpoint maps.
func (r *rule) addrProtoPort() []expr.Any {
	n := r.addrLen() / 4
	return []expr.Any{
		r.addrLoad("daddr", reg),
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg + n},
		&expr.Payload{DestRegister: reg + n + 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
	}
}

// vmapProtoPort: "meta l4proto . th dport vmap @set".
func (r *rule) vmapProtoPort(set string) *rule {
	return r.add(fmt.Sprintf("meta l4proto . th dport vmap @%s", set),
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg},
		&expr.Payload{DestRegister: reg + 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Lookup{SourceRegister: reg, SetName: set, IsDestRegSet: true, DestRegister: unix.NFT_REG_VERDICT})
}

// lookupSaddrDaddr: "ip saddr . ip daddr @set" (hairpin: a pod reaching itself).
func (r *rule) lookupSaddrDaddr(set string) *rule {
	w := r.ipWord()
	return r.add(fmt.Sprintf("%s saddr . %s daddr @%s", w, w, set),
		r.addrLoad("saddr", reg), r.addrLoad("daddr", reg+r.addrLen()/4),
		&expr.Lookup{SourceRegister: reg, SetName: set})
}

// setMasqMark: "meta mark set meta mark | 0x4000".
func (r *rule) setMasqMark() *rule {
	return r.add(fmt.Sprintf("meta mark set meta mark | 0x%x", masqBit),
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg},
		&expr.Bitwise{SourceRegister: reg, DestRegister: reg, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(^uint32(masqBit)), Xor: binaryutil.NativeEndian.PutUint32(masqBit)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: reg})
}

// masqMarked: "meta mark & 0x4000 != 0 meta mark set meta mark & ~0x4000":
// clearing the bit keeps a re-used skb (VXLAN) from being masqueraded twice.
func (r *rule) masqMarked() *rule {
	return r.add(fmt.Sprintf("meta mark & 0x%x != 0 meta mark set meta mark & 0x%x", masqBit, ^uint32(masqBit)),
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg},
		&expr.Bitwise{SourceRegister: reg, DestRegister: reg, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(masqBit), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg, Data: make([]byte, 4)},
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg},
		&expr.Bitwise{SourceRegister: reg, DestRegister: reg, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(^uint32(masqBit)), Xor: make([]byte, 4)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: reg})
}

func (r *rule) masquerade() *rule {
	return r.add("masquerade fully-random", &expr.Masq{FullyRandom: true})
}

func (r *rule) verdict(kind expr.VerdictKind, chain string) *rule {
	text := map[expr.VerdictKind]string{expr.VerdictJump: "jump " + chain, expr.VerdictGoto: "goto " + chain,
		expr.VerdictDrop: "drop", expr.VerdictReturn: "return", expr.VerdictAccept: "accept"}[kind]
	return r.add(text, &expr.Verdict{Kind: kind, Chain: chain})
}

func (r *rule) jump(chain string) *rule { return r.verdict(expr.VerdictJump, chain) }
func (r *rule) goTo(chain string) *rule { return r.verdict(expr.VerdictGoto, chain) }
func (r *rule) drop() *rule             { return r.verdict(expr.VerdictDrop, "") }

// reject answers with ICMP port unreachable (ECONNREFUSED for TCP), as
// kube-proxy does.
func (r *rule) reject() *rule {
	code := uint8(3) // ICMP_PORT_UNREACH
	if r.v6() {
		code = 4 // ICMPV6_PORT_UNREACH
	}
	return r.add("reject", &expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: code})
}

// dnatTo: "dnat to 10.0.0.1:80" for one endpoint.
func (r *rule) dnatTo(ep netip.AddrPort) *rule {
	return r.add(fmt.Sprintf("dnat %s to %s", r.ipWord(), ep),
		&expr.Immediate{Register: reg, Data: ep.Addr().AsSlice()},
		&expr.Immediate{Register: reg + r.addrLen()/4, Data: binaryutil.BigEndian.PutUint16(ep.Port())},
		r.nat())
}

// nat is the DNAT to the address and port the rule loaded from reg.
func (r *rule) nat() *expr.NAT { return natExprs[r.fam] }

// slotKey is a Service's part of its endpoints' keys in the shared maps:
// ClusterIP . protocol . port.
type slotKey struct {
	cip   netip.Addr
	addr  []byte
	proto uint8
	port  uint16
}

func newSlotKey(cip netip.Addr, proto uint8, p uint16) slotKey {
	return slotKey{cip, cip.AsSlice(), proto, p}
}

// elemID is Element{Key: k.at(i), Val: ep's address . port}.id(), built
// without the intermediate slices: a full build makes one per endpoint.
func (k slotKey) elemID(i uint32, ep netip.AddrPort) string {
	var buf [1 + 16 + 12 + 16 + 4]byte
	b := append(buf[:0], byte(len(k.addr)+12))
	b = append(b, k.addr...)
	b = append(b, k.proto, 0, 0, 0)
	b = append(binary.BigEndian.AppendUint16(b, k.port), 0, 0)
	b = binary.NativeEndian.AppendUint32(b, i)
	b = appendAddr(b, ep.Addr())
	b = append(binary.BigEndian.AppendUint16(b, ep.Port()), 0, 0)
	return string(b)
}

// hairpinID is Element{Key: a . a}.id(), the hairpin set's element for a.
func hairpinID(a netip.Addr) string {
	var buf [1 + 32]byte
	b := append(buf[:0], byte(2*a.BitLen()/8))
	return string(appendAddr(appendAddr(b, a), a))
}

// appendAddr appends a's 4 or 16 bytes.
func appendAddr(b []byte, a netip.Addr) []byte {
	if a.Is4() {
		v := a.As4()
		return append(b, v[:]...)
	}
	v := a.As16()
	return append(b, v[:]...)
}

func (k slotKey) text() string { return fmt.Sprintf("%s . %s . %d", k.cip, protoName(k.proto), k.port) }

// at is the key of slot i (numgen writes it in host byte order).
func (k slotKey) at(i uint32) []byte {
	return concat(k.addr, protoKey(k.proto), port(k.port), binaryutil.NativeEndian.PutUint32(i))
}

// dnatSlot: "dnat to 10.96.0.1 . tcp . 80 . numgen random mod N offset O
// map @set". One immediate per field at the field's own length (the kernel
// zero-pads the register); `nft list` shows them in hex all the same, as
// it has no type for constants in a concatenation.
func (r *rule) dnatSlot(k slotKey, n int, offset uint32, set string) *rule {
	text := fmt.Sprintf("dnat %s to %s . numgen random mod %d", r.ipWord(), k.text(), n)
	if offset != 0 {
		text += fmt.Sprintf(" offset %d", offset)
	}
	a := reg + uint32(len(k.addr))/4
	return r.add(text+" map @"+set,
		&expr.Immediate{Register: reg, Data: k.addr},
		&expr.Immediate{Register: a, Data: []byte{k.proto}},
		&expr.Immediate{Register: a + 1, Data: binaryutil.BigEndian.PutUint16(k.port)},
		&expr.Numgen{Register: a + 2, Modulus: uint32(n), Offset: offset, Type: unix.NFT_NG_RANDOM},
		&expr.Lookup{SourceRegister: reg, SetName: set, IsDestRegSet: true, DestRegister: reg},
		r.nat())
}

// dnatPick: "dnat ip to ip daddr . meta l4proto . th dport . numgen random
// mod N map @set". The Service's part of the key comes from the packet,
// not from immediates: only traffic to a ClusterIP comes here, so one
// chain serves every pooled Service with N endpoints.
func (r *rule) dnatPick(n int, set string) *rule {
	w := r.ipWord()
	return r.add(fmt.Sprintf("dnat %s to %s daddr . meta l4proto . th dport . numgen random mod %d map @%s", w, w, n, set),
		append(r.addrProtoPort(),
			&expr.Numgen{Register: reg + r.addrLen()/4 + 2, Modulus: uint32(n), Type: unix.NFT_NG_RANDOM},
			&expr.Lookup{SourceRegister: reg, SetName: set, IsDestRegSet: true, DestRegister: reg},
			r.nat())...)
}

// pickOneOf: "numgen random mod n == 0", true for one packet in n.
func (r *rule) pickOneOf(n int) *rule {
	return r.add(fmt.Sprintf("numgen random mod %d == 0", n), pickExprs[n]...)
}

// numgenVmap: "numgen random mod N vmap { 0 : goto a, ... }" (affinity).
func (r *rule) numgenVmap(chains []string) *rule {
	texts := make([]string, len(chains))
	elems := make([]nftables.SetElement, len(chains))
	for i, c := range chains {
		texts[i] = fmt.Sprintf("%d : goto %s", i, c)
		elems[i] = nftables.SetElement{Key: binaryutil.NativeEndian.PutUint32(uint32(i)), VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: c}}
	}
	r.anon = &AnonSet{Key: nftables.TypeInteger, Data: nftables.TypeVerdict, Elements: elems}
	return r.add(fmt.Sprintf("numgen random mod %d vmap { %s }", len(chains), strings.Join(texts, ", ")),
		&expr.Numgen{Register: reg, Modulus: uint32(len(chains)), Type: unix.NFT_NG_RANDOM},
		&expr.Lookup{SourceRegister: reg, SetName: anonSetName, IsDestRegSet: true, DestRegister: unix.NFT_REG_VERDICT})
}

// updateSaddr: "update @set { ip saddr }" refreshes a client's affinity.
func (r *rule) updateSaddr(set string, timeout time.Duration) *rule {
	return r.add(fmt.Sprintf("update @%s { %s saddr }", set, r.ipWord()),
		r.addrLoad("saddr", reg),
		&expr.Dynset{SrcRegKey: reg, SetName: set, Operation: unix.NFT_DYNSET_OP_UPDATE, Timeout: timeout})
}

func protoName(p uint8) string {
	switch p {
	case unix.IPPROTO_TCP:
		return "tcp"
	case unix.IPPROTO_UDP:
		return "udp"
	case unix.IPPROTO_SCTP:
		return "sctp"
	}
	return fmt.Sprint(p)
}

// port is a port in a concatenation: big endian, padded to a register.
func port(p uint16) []byte {
	b := make([]byte, 4)
	binary.BigEndian.PutUint16(b, p)
	return b
}

// concat joins key parts; each part must already be a multiple of 4 bytes.
func concat(parts ...[]byte) []byte {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func protoKey(p uint8) []byte { return []byte{p, 0, 0, 0} }

// intervalElements turns prefixes into the start/end pairs of an interval
// set. Overlapping prefixes are merged first: the kernel refuses overlaps.
func intervalElements(prefixes []netip.Prefix) []nftables.SetElement {
	var elems []nftables.SetElement
	for _, rg := range mergePrefixes(prefixes) {
		elems = append(elems, nftables.SetElement{Key: rg[0].AsSlice()})
		if end := rg[1].Next(); end.IsValid() {
			elems = append(elems, nftables.SetElement{Key: end.AsSlice(), IntervalEnd: true})
		}
	}
	return elems
}

// mergePrefixes returns the sorted, merged [first,last] address ranges.
func mergePrefixes(prefixes []netip.Prefix) [][2]netip.Addr {
	var rs [][2]netip.Addr
	for _, p := range prefixes {
		p = p.Masked()
		rs = append(rs, [2]netip.Addr{p.Addr(), lastAddr(p)})
	}
	sortRanges(rs)
	var out [][2]netip.Addr
	for _, r := range rs {
		if n := len(out); n > 0 && (out[n-1][1].Next() == r[0] || out[n-1][1].Compare(r[0]) >= 0) {
			if r[1].Compare(out[n-1][1]) > 0 {
				out[n-1][1] = r[1]
			}
			continue
		}
		out = append(out, r)
	}
	return out
}

func sortRanges(rs [][2]netip.Addr) {
	for i := 1; i < len(rs); i++ {
		for j := i; j > 0 && rs[j][0].Less(rs[j-1][0]); j-- {
			rs[j], rs[j-1] = rs[j-1], rs[j]
		}
	}
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}
