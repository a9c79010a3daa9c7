package policy

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strconv"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"go4.org/netipx"
	"golang.org/x/sys/unix"

	"github.com/netplane/netplane/nft"
	"github.com/netplane/netplane/nodeview"
)

// This file renders the model's Table onto the nft driver's typed table,
// whole for the first sync and then by what the model touched, so a
// partial sync's cost follows the change. Two of the model's forms have no
// counterpart in the driver, which has no interval sets and no named
// objects: an ipBlock's interval set becomes the anonymous interval set of
// each rule reading it (an ipBlock never changes, so neither do they), and
// a named counter becomes the counter statement of the deny rule, which
// Counters reads back by chain.

// TableID is the table NetworkPolicy programs.
var TableID = nft.TableID{Family: nftables.TableFamilyINet, Name: TableName}

// logSnaplen is how much of a denied packet NFLOG copies: the network and
// transport headers the log line is made of (IPv6's 40 bytes and a TCP
// header with options).
const logSnaplen = 128

// logBurst lets a few denied packets in a row be logged at once.
const logBurst = 5

// renderer keeps the rendering of one model's table.
type renderer struct {
	core *Table
	t    *nft.Table // nil until the first full rendering
}

func newRenderer(core *Table) *renderer { return &renderer{core: core} }

// full renders the whole table anew.
func (r *renderer) full() *nft.Table {
	r.t = nft.NewTable(TableID.Family, TableID.Name)
	for name, c := range r.core.Chains {
		r.t.Chains[name] = r.chain(c)
	}
	for name, s := range r.core.Sets {
		if ns := r.set(s); ns != nil {
			r.t.Sets[name] = ns
		}
	}
	return r.t
}

// apply brings the rendering up to date with what the model touched and
// names what changed for the driver. Chains and sets that went are
// dropped; sets of the driver adopted after a sync are changed through
// Mutable.
func (r *renderer) apply(tc *Touched) *nft.Touched {
	out := nft.NewTouched()
	for name := range tc.Chains {
		if c := r.core.Chains[name]; c != nil {
			r.t.Chains[name] = r.chain(c)
		} else {
			delete(r.t.Chains, name)
		}
		out.Chains[name] = true
	}
	for name := range tc.Sets {
		if s := r.core.Sets[name]; s != nil {
			if ns := r.set(s); ns != nil {
				r.t.Sets[name] = ns
				out.Sets[name] = true
			}
			continue
		}
		if _, ok := r.t.Sets[name]; ok {
			delete(r.t.Sets, name)
			out.Sets[name] = true
		}
	}
	for name, elems := range tc.Elems {
		s, ns := r.core.Sets[name], r.t.Sets[name]
		if s == nil || ns == nil {
			continue
		}
		m := ns.Mutable()
		for e := range elems {
			id := elementID(s.Kind, e)
			if s.Has(e) {
				m[id] = 1
			} else {
				delete(m, id)
			}
			out.Elem(name, id)
		}
	}
	return out
}

// set renders a named set with its elements; nil for an interval set,
// which rules hold themselves.
func (r *renderer) set(s *Set) *nft.Set {
	if s.Kind == RangeSet {
		return nil
	}
	return nft.PackedSet(s.Name, setSpec(s), s.sizeHint(), func(add func([]byte)) {
		var buf [nft.MaxVerdictIDLen]byte
		for e := range s.All() {
			add(appendElementID(buf[:0], s.Kind, e))
		}
	})
}

func setSpec(s *Set) nft.SetSpec {
	addr := nftables.TypeIPAddr
	if s.Family == nodeview.IPv6 {
		addr = nftables.TypeIP6Addr
	}
	switch s.Kind {
	case AddrProtoPortSet:
		return nft.SetSpec{Key: nftables.MustConcatSetType(addr, nftables.TypeInetProto, nftables.TypeInetService)}
	case AddrVerdictMap:
		return nft.SetSpec{Key: addr, Data: nftables.TypeVerdict}
	}
	return nft.SetSpec{Key: addr}
}

// elementID is the driver's id of an element of a set of kind.
func elementID(kind SetKind, e Element) string {
	var buf [nft.MaxVerdictIDLen]byte
	return string(appendElementID(buf[:0], kind, e))
}

// appendElementID builds the id of an element of a set of kind in buf.
func appendElementID(buf []byte, kind SetKind, e Element) []byte {
	w := nft.NewID(buf).Addr(e.Addr)
	switch kind {
	case AddrProtoPortSet:
		w = w.Proto(e.Proto).Port(e.Port)
	case AddrVerdictMap:
		w = w.EndKey().Verdict(expr.VerdictJump, e.Chain)
	}
	return w.Bytes()
}

var hooks = map[string]*nftables.ChainHook{"forward": nftables.ChainHookForward, "input": nftables.ChainHookInput}

func (r *renderer) chain(c *Chain) *nft.Chain {
	out := &nft.Chain{Name: c.Name, Rules: make([]nft.Rule, 0, len(c.Rules))}
	if c.Base != nil {
		out.Base = &nft.Hook{Type: nftables.ChainTypeFilter, Hook: *hooks[c.Base.Hook], Priority: int32(c.Base.Priority)}
	}
	for _, rl := range c.Rules {
		if nr, ok := r.rule(rl); ok {
			out.Rules = append(out.Rules, nr)
		}
	}
	return out
}

// rule renders one rule, its matches in the order of Rule.Text. False for
// a rule that can match nothing (an ipBlock whose exceptions cover it),
// which is left out.
func (r *renderer) rule(rl Rule) (nft.Rule, bool) {
	b := nft.NewRule(nftables.TableFamilyINet)
	if rl.Established {
		b.CtState(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED)
	}
	if rl.NeighborDiscovery {
		b.NFProto(true).L4Proto(unix.IPPROTO_ICMPV6).Add("icmpv6 type 133-136",
			&expr.Payload{DestRegister: nft.Reg, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
			&expr.Range{Op: expr.CmpOpEq, Register: nft.Reg, FromData: []byte{133}, ToData: []byte{136}})
	}
	if rl.Family != AnyFamily {
		b.NFProto(rl.Family == nodeview.IPv6)
	}
	field := nft.Saddr
	if rl.Field == Daddr {
		field = nft.Daddr
	}
	if rl.Set != "" {
		s := r.core.Sets[rl.Set]
		if s == nil || s.Kind != RangeSet {
			b.Lookup(rl.Set, field)
		} else if prefixes := rangePrefixes(s); len(prefixes) > 0 {
			b.MatchPrefixes(field, prefixes, false)
		} else {
			return nft.Rule{}, false
		}
	}
	if rl.Proto != 0 {
		b.L4Proto(rl.Proto)
	}
	if rl.PortFrom != 0 {
		dport(b, rl.PortFrom, rl.PortTo)
	}
	if rl.PortSet != "" {
		b.Lookup(rl.PortSet, nft.Daddr, nft.L4Proto, nft.THDport)
	}
	if rl.Vmap != "" {
		b.Vmap(rl.Vmap, field)
	}
	if rl.Counter != "" {
		b.Counter()
	}
	if rl.Log.Rate != 0 {
		logTo(b, rl.Log)
	}
	switch rl.Verdict.Kind {
	case Accept:
		b.Accept()
	case Drop:
		b.Drop()
	case Return:
		b.Return()
	case Jump:
		b.Jump(rl.Verdict.Chain)
	case Goto:
		b.Goto(rl.Verdict.Chain)
	}
	return b.Rule(), true
}

// rangePrefixes are an interval set's ranges as prefixes, in order.
func rangePrefixes(s *Set) []netip.Prefix {
	var sb netipx.IPSetBuilder
	for e := range s.All() {
		sb.AddRange(netipx.IPRangeFrom(e.Addr, e.End))
	}
	set, _ := sb.IPSet() // no error: nothing is removed
	return set.Prefixes()
}

// dport: "th dport 80" or "th dport 80-81".
func dport(b *nft.RuleBuilder, from, to uint16) {
	load := &expr.Payload{DestRegister: nft.Reg, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}
	if from == to {
		b.Add("th dport "+strconv.Itoa(int(from)), load, &expr.Cmp{Op: expr.CmpOpEq, Register: nft.Reg, Data: be16(from)})
		return
	}
	b.Add(fmt.Sprintf("th dport %d-%d", from, to), load,
		&expr.Range{Op: expr.CmpOpEq, Register: nft.Reg, FromData: be16(from), ToData: be16(to)})
}

func be16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }

// logTo: a rate-limited NFLOG statement copying the packet's headers.
func logTo(b *nft.RuleBuilder, l Log) {
	b.Limit(uint64(l.Rate), expr.LimitTimeSecond, logBurst)
	b.Add(fmt.Sprintf("log prefix %s group %d snaplen %d", strconv.Quote(l.Prefix), l.Group, logSnaplen),
		&expr.Log{Key: 1<<unix.NFTA_LOG_GROUP | 1<<unix.NFTA_LOG_PREFIX | 1<<unix.NFTA_LOG_SNAPLEN,
			Group: l.Group, Snaplen: logSnaplen, Data: []byte(l.Prefix)})
}
