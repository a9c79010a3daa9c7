// Package nft builds the few nftables rules pod networking needs (hostPort
// DNAT, hairpin and egress masquerade) as google/nftables expressions, and
// replaces a whole table of ours in one atomic transaction. Tables are small
// (one rule per hostPort, a handful per node), so rewriting the table on
// every change is simpler and as fast as diffing, and it heals any edit made
// by someone else.
package nft

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// Replace atomically swaps the inet table `name` for what build adds to it:
// "add table; delete table; add table ..." in one batch, so packets see
// either the old or the new rules. With build nil the table is just removed.
func Replace(name string, build func(c *nftables.Conn, t *nftables.Table)) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("open nftables: %w", err)
	}
	defer c.CloseLasting()
	t := &nftables.Table{Name: name, Family: nftables.TableFamilyINet}
	c.AddTable(t)
	c.DelTable(t)
	if build != nil {
		c.AddTable(t)
		build(c, t)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("program nftables table inet %s: %w", name, err)
	}
	return nil
}

// Chain adds a base chain of the given nat/filter type and hook.
func Chain(c *nftables.Conn, t *nftables.Table, name string, typ nftables.ChainType, hook *nftables.ChainHook, prio *nftables.ChainPriority) *nftables.Chain {
	return c.AddChain(&nftables.Chain{Name: name, Table: t, Type: typ, Hooknum: hook, Priority: prio})
}

// Rule appends a rule made of the given expression groups.
func Rule(c *nftables.Conn, ch *nftables.Chain, groups ...[]expr.Any) {
	c.AddRule(&nftables.Rule{Table: ch.Table, Chain: ch, Exprs: slices.Concat(groups...)})
}

// CommentedRule is Rule with a comment (`nft list` shows it), by which
// RuleComments finds the rule again.
func CommentedRule(c *nftables.Conn, ch *nftables.Chain, comment string, groups ...[]expr.Any) {
	c.AddRule(&nftables.Rule{Table: ch.Table, Chain: ch, Exprs: slices.Concat(groups...),
		UserData: userdata.AppendString(nil, userdata.TypeComment, comment)})
}

// RuleComments lists the comments of the rules in a chain of inet table
// `table`; a missing table or chain has none.
func RuleComments(table, chain string) ([]string, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, err
	}
	defer c.CloseLasting()
	t := &nftables.Table{Name: table, Family: nftables.TableFamilyINet}
	rules, err := c.GetRules(t, &nftables.Chain{Name: chain, Table: t})
	if err != nil {
		return nil, fmt.Errorf("list chain %s of table inet %s: %w", chain, table, err)
	}
	var out []string
	for _, r := range rules {
		if s, ok := userdata.GetString(r.UserData, userdata.TypeComment); ok {
			out = append(out, s)
		}
	}
	return out, nil
}

func family(a netip.Addr) []expr.Any {
	proto := byte(unix.NFPROTO_IPV4)
	if a.Is6() {
		proto = unix.NFPROTO_IPV6
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
	}
}

// addrOffset is where the source or destination address sits in the IP header.
func addrOffset(a netip.Addr, dst bool) (offset, length uint32) {
	switch {
	case a.Is4() && dst:
		return 16, 4
	case a.Is4():
		return 12, 4
	case dst:
		return 24, 16
	default:
		return 8, 16
	}
}

// InPrefix matches (or with neq, does not match) the source or destination
// address against a prefix, including the family check.
func InPrefix(p netip.Prefix, dst, neq bool) []expr.Any {
	p = p.Masked()
	off, n := addrOffset(p.Addr(), dst)
	op := expr.CmpOpEq
	if neq {
		op = expr.CmpOpNeq
	}
	mask := net.CIDRMask(p.Bits(), p.Addr().BitLen())
	return append(family(p.Addr()),
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: n, Mask: mask, Xor: make([]byte, n)},
		&expr.Cmp{Op: op, Register: 1, Data: p.Addr().AsSlice()},
	)
}

// Addr matches one source or destination address.
func Addr(a netip.Addr, dst bool) []expr.Any {
	return InPrefix(netip.PrefixFrom(a, a.BitLen()), dst, false)
}

// SameFamily matches packets of a's family only.
func SameFamily(a netip.Addr) []expr.Any { return family(a) }

// L4Port matches the transport protocol ("tcp" or "udp") and destination port.
func L4Port(proto string, port uint16) []expr.Any {
	p := byte(unix.IPPROTO_TCP)
	if proto == "udp" {
		p = unix.IPPROTO_UDP
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
	}
}

// LocalDst matches packets addressed to one of this node's own addresses.
func LocalDst() []expr.Any {
	return []expr.Any{
		&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)},
	}
}

// WasDNATed matches connections whose destination was rewritten.
func WasDNATed() []expr.Any {
	const ipsDstNAT = 1 << 5 // IPS_DST_NAT in the conntrack status bits
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATUS},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(ipsDstNAT), Xor: binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}

// DNAT rewrites the destination to to:port.
func DNAT(to netip.Addr, port uint16) []expr.Any {
	fam := uint32(unix.NFPROTO_IPV4)
	if to.Is6() {
		fam = unix.NFPROTO_IPV6
	}
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: to.AsSlice()},
		&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(port)},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: fam, RegAddrMin: 1, RegProtoMin: 2, Specified: true},
	}
}

// Masquerade rewrites the source to the outgoing interface's address.
func Masquerade() []expr.Any { return []expr.Any{&expr.Masq{}} }

// Return leaves the chain.
func Return() []expr.Any { return []expr.Any{&expr.Verdict{Kind: expr.VerdictReturn}} }

// Accept accepts the packet in this chain.
func Accept() []expr.Any { return []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}} }

// Jump continues in another chain.
func Jump(chain string) []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: chain}}
}

// TableExists reports whether inet table name exists.
func TableExists(name string) (bool, error) {
	c, err := nftables.New()
	if err != nil {
		return false, err
	}
	defer c.CloseLasting()
	_, err = c.ListTableOfFamily(name, nftables.TableFamilyINet)
	if err != nil {
		if isNotExist(err) {
			return false, nil
		}
		return false, err
	}
	return true, nil
}

func isNotExist(err error) bool { return errors.Is(err, unix.ENOENT) }
