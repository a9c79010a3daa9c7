package nft

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"go4.org/netipx"
	"golang.org/x/sys/unix"
)

// This file turns statements into both nft text and kernel expressions, so
// the two can never disagree. Registers are numbered as 32-bit registers
// (Reg upward) throughout, which is what concatenations need.

// Reg is the first register a statement loads into; a concatenation's
// fields take the registers after it.
const Reg = unix.NFT_REG32_00

// Field is a packet field a statement matches or loads.
type Field uint8

const (
	Saddr   Field = iota + 1 // ip saddr, ip6 saddr
	Daddr                    // ip daddr, ip6 daddr
	L4Proto                  // meta l4proto
	THDport                  // th dport
	THSport                  // th sport
	Mark                     // meta mark
)

// RuleBuilder accumulates statements into a Rule.
type RuleBuilder struct {
	v6    bool // addresses are IPv6 ones
	inet  bool // the table is of the inet family
	text  []string
	exprs []expr.Any
	anon  *AnonSet
}

// NewRule starts a rule of a table of family. In an inet table, address
// statements need NFProto first: it says which family they are of.
func NewRule(family nftables.TableFamily) *RuleBuilder {
	return &RuleBuilder{v6: family == nftables.TableFamilyIPv6, inet: family == nftables.TableFamilyINet}
}

// Add appends a statement of text implemented by e.
func (r *RuleBuilder) Add(text string, e ...expr.Any) *RuleBuilder {
	r.text = append(r.text, text)
	r.exprs = append(r.exprs, e...)
	return r
}

// Rule is the rule of the statements added so far.
func (r *RuleBuilder) Rule() Rule {
	text := strings.Join(r.text, " ")
	return Rule{Text: text, FP: Fingerprint(text), Exprs: r.exprs, Anon: r.anon}
}

// Fingerprint is what a rule's comment in the kernel holds: a hash of its
// text, by which a read-back knows the rule without decoding it.
func Fingerprint(text string) string {
	sum := sha256.Sum256([]byte(text))
	return "netplane:" + base32.StdEncoding.EncodeToString(sum[:])[:20]
}

// IPWord is "ip" or "ip6", as the rule's address statements begin.
func (r *RuleBuilder) IPWord() string {
	if r.v6 {
		return "ip6"
	}
	return "ip"
}

// AddrLen is the length of the rule's addresses in bytes.
func (r *RuleBuilder) AddrLen() uint32 {
	if r.v6 {
		return 16
	}
	return 4
}

// NFProto: "meta nfproto ipv4" (or ipv6); the address statements after it
// are of that family. Only an inet table needs it.
func (r *RuleBuilder) NFProto(v6 bool) *RuleBuilder {
	r.v6 = v6
	p, word := byte(unix.NFPROTO_IPV4), "ipv4"
	if v6 {
		p, word = unix.NFPROTO_IPV6, "ipv6"
	}
	return r.Add("meta nfproto "+word,
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: Reg},
		&expr.Cmp{Op: expr.CmpOpEq, Register: Reg, Data: []byte{p}})
}

// FieldsText is the fields as nft writes a concatenation of them.
func (r *RuleBuilder) FieldsText(fields ...Field) string {
	texts := make([]string, len(fields))
	for i, f := range fields {
		texts[i] = r.fieldText(f)
	}
	return strings.Join(texts, " . ")
}

func (r *RuleBuilder) fieldText(f Field) string {
	switch f {
	case Saddr:
		return r.IPWord() + " saddr"
	case Daddr:
		return r.IPWord() + " daddr"
	case L4Proto:
		return "meta l4proto"
	case THDport:
		return "th dport"
	case THSport:
		return "th sport"
	case Mark:
		return "meta mark"
	}
	return fmt.Sprintf("field%d", f)
}

// Load loads the fields into consecutive registers from Reg on, as a
// concatenation's key.
func (r *RuleBuilder) Load(fields ...Field) []expr.Any {
	out := make([]expr.Any, len(fields))
	dst := uint32(Reg)
	for i, f := range fields {
		out[i] = r.load(f, dst)
		dst += r.regs(f)
	}
	return out
}

// regs is how many registers a field takes.
func (r *RuleBuilder) regs(f Field) uint32 {
	if f == Saddr || f == Daddr {
		return r.AddrLen() / 4
	}
	return 1
}

func (r *RuleBuilder) load(f Field, dst uint32) expr.Any {
	switch f {
	case Saddr, Daddr:
		off := map[Field]uint32{Saddr: 12, Daddr: 16}[f]
		if r.v6 {
			off = map[Field]uint32{Saddr: 8, Daddr: 24}[f]
		}
		return &expr.Payload{DestRegister: dst, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: r.AddrLen()}
	case L4Proto:
		return &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: dst}
	case THDport, THSport:
		off := uint32(2)
		if f == THSport {
			off = 0
		}
		return &expr.Payload{DestRegister: dst, Base: expr.PayloadBaseTransportHeader, Offset: off, Len: 2}
	}
	return &expr.Meta{Key: expr.MetaKeyMARK, Register: dst}
}

// MatchPrefix: "ip saddr 10.0.0.0/8", "ip daddr != 10.96.0.1" (field is
// Saddr or Daddr).
func (r *RuleBuilder) MatchPrefix(field Field, p netip.Prefix, neq bool) *RuleBuilder {
	op, word := expr.CmpOpEq, ""
	if neq {
		op, word = expr.CmpOpNeq, "!= "
	}
	ex := []expr.Any{r.load(field, Reg)}
	if p.Bits() < p.Addr().BitLen() {
		mask := []byte(net.CIDRMask(p.Bits(), p.Addr().BitLen()))
		ex = append(ex, &expr.Bitwise{SourceRegister: Reg, DestRegister: Reg, Len: r.AddrLen(), Mask: mask, Xor: make([]byte, len(mask))})
	}
	ex = append(ex, &expr.Cmp{Op: op, Register: Reg, Data: p.Masked().Addr().AsSlice()})
	return r.Add(r.fieldText(field)+" "+word+prefixText(p), ex...)
}

func prefixText(p netip.Prefix) string {
	if p.IsSingleIP() {
		return p.Addr().String()
	}
	return p.Masked().String()
}

// MatchPrefixes: "ip saddr 10.0.0.0/8" for one prefix, "ip saddr != {
// 10.0.0.0/8, 172.16.0.0/12 }" (InPrefixes) for several.
func (r *RuleBuilder) MatchPrefixes(field Field, prefixes []netip.Prefix, neq bool) *RuleBuilder {
	if len(prefixes) == 1 {
		return r.MatchPrefix(field, prefixes[0], neq)
	}
	return r.InPrefixes(field, prefixes, neq)
}

// InPrefixes: "ip daddr { 10.96.0.0/16, ... }", or with neq "!= { ... }",
// an anonymous interval set. A rule holds at most one anonymous set.
func (r *RuleBuilder) InPrefixes(field Field, prefixes []netip.Prefix, neq bool) *RuleBuilder {
	texts := make([]string, len(prefixes))
	for i, p := range prefixes {
		texts[i] = prefixText(p)
	}
	key := nftables.TypeIPAddr
	if r.v6 {
		key = nftables.TypeIP6Addr
	}
	op := ""
	if neq {
		op = "!= "
	}
	r.anon = &AnonSet{Key: key, Interval: true, Elements: intervalElements(prefixes)}
	return r.Add(fmt.Sprintf("%s %s{ %s }", r.fieldText(field), op, strings.Join(texts, ", ")),
		r.load(field, Reg), &expr.Lookup{SourceRegister: Reg, SetName: AnonSetName, Invert: neq})
}

// intervalElements are the start and end elements of an interval set
// holding prefixes. Overlapping and adjacent prefixes are merged first: the
// kernel refuses overlaps.
func intervalElements(prefixes []netip.Prefix) []nftables.SetElement {
	var b netipx.IPSetBuilder
	for _, p := range prefixes {
		b.AddPrefix(p.Masked())
	}
	set, _ := b.IPSet() // no error: nothing is removed
	var elems []nftables.SetElement
	for _, rg := range set.Ranges() {
		elems = append(elems, nftables.SetElement{Key: rg.From().AsSlice()})
		if end := rg.To().Next(); end.IsValid() {
			elems = append(elems, nftables.SetElement{Key: end.AsSlice(), IntervalEnd: true})
		}
	}
	return elems
}

// Lookup: "ip saddr . ip daddr @set", the fields' concatenation in a set.
func (r *RuleBuilder) Lookup(set string, fields ...Field) *RuleBuilder {
	return r.Add(r.FieldsText(fields...)+" @"+set,
		append(r.Load(fields...), &expr.Lookup{SourceRegister: Reg, SetName: set})...)
}

// Vmap: "ip daddr . meta l4proto . th dport vmap @set", the verdict the
// fields' concatenation maps to.
func (r *RuleBuilder) Vmap(set string, fields ...Field) *RuleBuilder {
	return r.Add(r.FieldsText(fields...)+" vmap @"+set,
		append(r.Load(fields...), &expr.Lookup{SourceRegister: Reg, SetName: set, IsDestRegSet: true, DestRegister: unix.NFT_REG_VERDICT})...)
}

var ctStates = []struct {
	bit  uint32
	name string
}{
	{expr.CtStateBitINVALID, "invalid"}, {expr.CtStateBitESTABLISHED, "established"},
	{expr.CtStateBitRELATED, "related"}, {expr.CtStateBitNEW, "new"}, {expr.CtStateBitUNTRACKED, "untracked"},
}

// CtState: "ct state new", "ct state established,related": the connection
// is in one of the states (expr.CtStateBit* values).
func (r *RuleBuilder) CtState(bits uint32) *RuleBuilder {
	var names []string
	for _, s := range ctStates {
		if bits&s.bit != 0 {
			names = append(names, s.name)
		}
	}
	return r.Add("ct state "+strings.Join(names, ","),
		&expr.Ct{Register: Reg, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: Reg, DestRegister: Reg, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(bits), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: Reg, Data: make([]byte, 4)})
}

// Expressions are never modified once built, so the common ones are shared
// by every rule using them: the proxy has over 100,000 rules at 10,000
// Services, each with the same protocol match and NAT and, per endpoint
// count, the same numgen.
var (
	l4protoExprs = map[uint8][]expr.Any{}
	pickExprs    [maxSharedPick + 1][]expr.Any
	natExprs     [2]*expr.NAT // IPv4, IPv6
)

// maxSharedPick is the largest n whose "numgen random mod n == 0" is shared.
const maxSharedPick = 32

func init() {
	for _, p := range []uint8{unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_SCTP} {
		l4protoExprs[p] = l4protoMatch(p)
	}
	for n := 2; n <= maxSharedPick; n++ {
		pickExprs[n] = pickMatch(n)
	}
	// The address in the first registers, the port in the next one.
	natExprs[0] = &expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: Reg, RegProtoMin: Reg + 1, Specified: true}
	natExprs[1] = &expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV6, RegAddrMin: Reg, RegProtoMin: Reg + 4, Specified: true}
}

func l4protoMatch(p uint8) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: Reg},
		&expr.Cmp{Op: expr.CmpOpEq, Register: Reg, Data: []byte{p}}}
}

func pickMatch(n int) []expr.Any {
	return []expr.Any{
		&expr.Numgen{Register: Reg, Modulus: uint32(n), Type: unix.NFT_NG_RANDOM},
		&expr.Cmp{Op: expr.CmpOpEq, Register: Reg, Data: make([]byte, 4)}}
}

// L4Proto: "meta l4proto tcp".
func (r *RuleBuilder) L4Proto(p uint8) *RuleBuilder {
	e, ok := l4protoExprs[p]
	if !ok {
		e = l4protoMatch(p)
	}
	return r.Add("meta l4proto "+ProtoName(p), e...)
}

// FibLocal: "fib saddr type local" (field Saddr: the packet comes from this
// node) or "fib daddr type local" (Daddr: it is addressed to this node).
func (r *RuleBuilder) FibLocal(field Field) *RuleBuilder {
	word := "saddr"
	if field == Daddr {
		word = "daddr"
	}
	return r.Add("fib "+word+" type local",
		&expr.Fib{Register: Reg, FlagSADDR: field != Daddr, FlagDADDR: field == Daddr, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: Reg, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)})
}

// MarkSet: "meta mark set meta mark | 0x4000", setting bits of the mark.
func (r *RuleBuilder) MarkSet(bits uint32) *RuleBuilder {
	return r.Add(fmt.Sprintf("meta mark set meta mark | 0x%x", bits),
		&expr.Meta{Key: expr.MetaKeyMARK, Register: Reg},
		&expr.Bitwise{SourceRegister: Reg, DestRegister: Reg, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(^bits), Xor: binaryutil.NativeEndian.PutUint32(bits)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: Reg})
}

// MarkHas: "meta mark & 0x4000 != 0", some of bits is set.
func (r *RuleBuilder) MarkHas(bits uint32) *RuleBuilder {
	return r.Add(fmt.Sprintf("meta mark & 0x%x != 0", bits),
		&expr.Meta{Key: expr.MetaKeyMARK, Register: Reg},
		&expr.Bitwise{SourceRegister: Reg, DestRegister: Reg, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(bits), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: Reg, Data: make([]byte, 4)})
}

// MarkClear: "meta mark set meta mark & 0xffffbfff", clearing bits.
func (r *RuleBuilder) MarkClear(bits uint32) *RuleBuilder {
	return r.Add(fmt.Sprintf("meta mark set meta mark & 0x%x", ^bits),
		&expr.Meta{Key: expr.MetaKeyMARK, Register: Reg},
		&expr.Bitwise{SourceRegister: Reg, DestRegister: Reg, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(^bits), Xor: make([]byte, 4)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: Reg})
}

// Masquerade: "masquerade", or "masquerade fully-random".
func (r *RuleBuilder) Masquerade(fullyRandom bool) *RuleBuilder {
	text := "masquerade"
	if fullyRandom {
		text += " fully-random"
	}
	return r.Add(text, &expr.Masq{FullyRandom: fullyRandom})
}

// SNATTo: "snat ip to 10.244.1.0", with "fully-random" when asked.
func (r *RuleBuilder) SNATTo(a netip.Addr, fullyRandom bool) *RuleBuilder {
	text := fmt.Sprintf("snat %s to %s", r.IPWord(), a)
	if fullyRandom {
		text += " fully-random"
	}
	fam := uint32(unix.NFPROTO_IPV4)
	if a.Is6() {
		fam = unix.NFPROTO_IPV6
	}
	return r.Add(text, &expr.Immediate{Register: Reg, Data: a.AsSlice()},
		&expr.NAT{Type: expr.NATTypeSourceNAT, Family: fam, RegAddrMin: Reg, FullyRandom: fullyRandom})
}

// Oifname: `oifname "name"`.
func (r *RuleBuilder) Oifname(name string) *RuleBuilder {
	data := make([]byte, unix.IFNAMSIZ)
	copy(data, name)
	return r.Add(`oifname "`+name+`"`,
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: Reg},
		&expr.Cmp{Op: expr.CmpOpEq, Register: Reg, Data: data})
}

// Verdict: "jump c", "goto c", "drop", "accept", "return".
func (r *RuleBuilder) Verdict(kind expr.VerdictKind, chain string) *RuleBuilder {
	v := &expr.Verdict{Kind: kind, Chain: chain}
	return r.Add(verdictText(v), v)
}

func (r *RuleBuilder) Jump(chain string) *RuleBuilder { return r.Verdict(expr.VerdictJump, chain) }
func (r *RuleBuilder) Goto(chain string) *RuleBuilder { return r.Verdict(expr.VerdictGoto, chain) }
func (r *RuleBuilder) Drop() *RuleBuilder             { return r.Verdict(expr.VerdictDrop, "") }
func (r *RuleBuilder) Accept() *RuleBuilder           { return r.Verdict(expr.VerdictAccept, "") }
func (r *RuleBuilder) Return() *RuleBuilder           { return r.Verdict(expr.VerdictReturn, "") }

// Reject answers with ICMP port unreachable (ECONNREFUSED for TCP), as
// kube-proxy does; in an inet table with its family's ICMP.
func (r *RuleBuilder) Reject() *RuleBuilder {
	switch {
	case r.inet:
		return r.Add("reject", &expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_PORT_UNREACH})
	case r.v6:
		return r.Add("reject", &expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: 4}) // ICMPV6_PORT_UNREACH
	}
	return r.Add("reject", &expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: 3}) // ICMP_PORT_UNREACH
}

// DNATTo: "dnat ip to 10.0.0.1:80".
func (r *RuleBuilder) DNATTo(ep netip.AddrPort) *RuleBuilder {
	return r.Add(fmt.Sprintf("dnat %s to %s", r.IPWord(), ep),
		&expr.Immediate{Register: Reg, Data: ep.Addr().AsSlice()},
		&expr.Immediate{Register: Reg + r.AddrLen()/4, Data: binaryutil.BigEndian.PutUint16(ep.Port())},
		r.NAT())
}

// NAT is the DNAT to the address in the registers from Reg on and the
// port in the register after it, for statements that load them otherwise
// (from a map). One value serves every rule.
func (r *RuleBuilder) NAT() *expr.NAT {
	if r.v6 {
		return natExprs[1]
	}
	return natExprs[0]
}

// PickOneOf: "numgen random mod n == 0", true for one packet in n.
func (r *RuleBuilder) PickOneOf(n int) *RuleBuilder {
	var e []expr.Any
	if n <= maxSharedPick {
		e = pickExprs[n]
	}
	if e == nil {
		e = pickMatch(n)
	}
	return r.Add(fmt.Sprintf("numgen random mod %d == 0", n), e...)
}

// NumgenVmap: "numgen random mod N vmap { 0 : goto a, ... }", one of the
// chains at random.
func (r *RuleBuilder) NumgenVmap(chains []string) *RuleBuilder {
	texts := make([]string, len(chains))
	elems := make([]nftables.SetElement, len(chains))
	for i, c := range chains {
		texts[i] = fmt.Sprintf("%d : goto %s", i, c)
		elems[i] = nftables.SetElement{Key: binaryutil.NativeEndian.PutUint32(uint32(i)), VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: c}}
	}
	r.anon = &AnonSet{Key: nftables.TypeInteger, Data: nftables.TypeVerdict, Elements: elems}
	return r.Add(fmt.Sprintf("numgen random mod %d vmap { %s }", len(chains), strings.Join(texts, ", ")),
		&expr.Numgen{Register: Reg, Modulus: uint32(len(chains)), Type: unix.NFT_NG_RANDOM},
		&expr.Lookup{SourceRegister: Reg, SetName: AnonSetName, IsDestRegSet: true, DestRegister: unix.NFT_REG_VERDICT})
}

// Update: "update @set { ip saddr }" adds the field's value to a dynamic
// set, or refreshes its timeout there.
func (r *RuleBuilder) Update(set string, field Field, timeout time.Duration) *RuleBuilder {
	return r.Add(fmt.Sprintf("update @%s { %s }", set, r.fieldText(field)),
		r.load(field, Reg),
		&expr.Dynset{SrcRegKey: Reg, SetName: set, Operation: unix.NFT_DYNSET_OP_UPDATE, Timeout: timeout})
}

// Counter: "counter".
func (r *RuleBuilder) Counter() *RuleBuilder { return r.Add("counter", &expr.Counter{}) }

// Log: `log prefix "prefix"`.
func (r *RuleBuilder) Log(prefix string) *RuleBuilder {
	return r.Add(fmt.Sprintf("log prefix %q", prefix), &expr.Log{Key: 1 << unix.NFTA_LOG_PREFIX, Data: []byte(prefix)})
}

var limitUnits = map[expr.LimitTime]string{
	expr.LimitTimeSecond: "second", expr.LimitTimeMinute: "minute", expr.LimitTimeHour: "hour",
	expr.LimitTimeDay: "day", expr.LimitTimeWeek: "week",
}

// Limit: "limit rate 10/second burst 5 packets", true while packets come
// no faster.
func (r *RuleBuilder) Limit(rate uint64, per expr.LimitTime, burst uint32) *RuleBuilder {
	return r.Add(fmt.Sprintf("limit rate %d/%s burst %d packets", rate, limitUnits[per], burst),
		&expr.Limit{Type: expr.LimitTypePkts, Rate: rate, Unit: per, Burst: burst})
}

// MatchPort: "th dport 8080" (field THDport or THSport); a transport
// protocol match (L4Proto) must come first.
func (r *RuleBuilder) MatchPort(field Field, port uint16) *RuleBuilder {
	return r.Add(fmt.Sprintf("%s %d", r.fieldText(field), port),
		r.load(field, Reg), &expr.Cmp{Op: expr.CmpOpEq, Register: Reg, Data: binaryutil.BigEndian.PutUint16(port)})
}

// CtStatusDNAT: "ct status dnat", the connection's destination was
// rewritten (by a DNAT of this node).
func (r *RuleBuilder) CtStatusDNAT() *RuleBuilder {
	const ipsDstNAT = 1 << 5 // IPS_DST_NAT of the conntrack status bits
	return r.Add("ct status dnat",
		&expr.Ct{Register: Reg, Key: expr.CtKeySTATUS},
		&expr.Bitwise{SourceRegister: Reg, DestRegister: Reg, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(ipsDstNAT), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: Reg, Data: make([]byte, 4)})
}
