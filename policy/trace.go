package policy

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/netplane/netplane/nodeview"
)

// Packet is the first packet of a connection, or a later one
// (Established), as a hook of the node sees it.
type Packet struct {
	Hook        string // "forward", "input", "output"
	Src, Dst    netip.Addr
	Proto       uint8
	Port        uint16 // destination port
	ICMPType    uint8  // ICMPv6 type, when Proto is 58
	Established bool
}

// Trace is what a table does to a packet: the verdict, the named counters
// it hit and the rules that matched, in order, for people asking why.
type Trace struct {
	Accepted bool
	Counters []string
	Steps    []string
}

// Trace evaluates the table for one packet as the kernel would: the base
// chains of the packet's hook in priority order, verdict maps, jumps and
// returns. It reads only the forms of Rule the model makes.
func (t *Table) Trace(p Packet) Trace {
	var bases []*Chain
	for _, c := range t.Chains {
		if c.Base != nil && c.Base.Hook == p.Hook {
			bases = append(bases, c)
		}
	}
	slices.SortFunc(bases, func(a, b *Chain) int {
		return cmp.Or(cmp.Compare(a.Base.Priority, b.Base.Priority), cmp.Compare(a.Name, b.Name))
	})
	tr := Trace{Accepted: true}
	for _, c := range bases {
		if !t.run(c, p, &tr) {
			tr.Accepted = false
			return tr
		}
	}
	return tr
}

// frame is a chain being run and the rule to run next.
type frame struct {
	c *Chain
	i int
}

// run runs a base chain; false means dropped.
func (t *Table) run(base *Chain, p Packet, tr *Trace) bool {
	stack := []frame{{base, 0}}
	for len(stack) > 0 {
		f := &stack[len(stack)-1]
		if f.i >= len(f.c.Rules) {
			stack = stack[:len(stack)-1] // end of chain: back to the caller
			continue
		}
		r := f.c.Rules[f.i]
		f.i++
		v, ok := t.match(r, p)
		if !ok {
			continue
		}
		tr.Steps = append(tr.Steps, fmt.Sprintf("%s: %s", f.c.Name, r.Text()))
		if r.Counter != "" {
			tr.Counters = append(tr.Counters, r.Counter)
		}
		switch v.Kind {
		case Accept:
			return true
		case Drop:
			return false
		case Return:
			stack = stack[:len(stack)-1]
		case Jump:
			stack = append(stack, frame{t.Chains[v.Chain], 0})
		case Goto:
			stack[len(stack)-1] = frame{t.Chains[v.Chain], 0}
		}
	}
	return true // the base chain's policy
}

// match reports whether r matches p, and the verdict it then gives (a
// verdict map's element's, for a vmap rule).
func (t *Table) match(r Rule, p Packet) (Verdict, bool) {
	if r.Established && !p.Established {
		return Verdict{}, false
	}
	if r.NeighborDiscovery && (p.Proto != unix.IPPROTO_ICMPV6 || p.ICMPType < 133 || p.ICMPType > 136) {
		return Verdict{}, false
	}
	if r.Family != AnyFamily && nodeview.FamilyOf(p.Src) != r.Family {
		return Verdict{}, false
	}
	addr := p.Src
	if r.Field == Daddr {
		addr = p.Dst
	}
	if r.Set != "" && !t.contains(r.Set, addr) {
		return Verdict{}, false
	}
	if r.Proto != 0 && r.Proto != p.Proto {
		return Verdict{}, false
	}
	if r.PortFrom != 0 && (p.Port < r.PortFrom || p.Port > r.PortTo) {
		return Verdict{}, false
	}
	if r.PortSet != "" {
		if s := t.Sets[r.PortSet]; s == nil || !s.Has(Element{Addr: p.Dst, Proto: p.Proto, Port: p.Port}) {
			return Verdict{}, false
		}
	}
	if r.Vmap != "" {
		return t.lookup(r.Vmap, addr)
	}
	return r.Verdict, true
}

func (t *Table) contains(set string, a netip.Addr) bool {
	s := t.Sets[set]
	if s == nil {
		return false
	}
	if s.Kind != RangeSet {
		return s.Has(Element{Addr: a})
	}
	for e := range s.All() {
		if e.Addr.Compare(a) <= 0 && a.Compare(e.End) <= 0 {
			return true
		}
	}
	return false
}

// lookup finds a's element in a verdict map.
func (t *Table) lookup(vmap string, a netip.Addr) (Verdict, bool) {
	s := t.Sets[vmap]
	if s == nil {
		return Verdict{}, false
	}
	for e := range s.All() {
		if e.Addr == a {
			return Verdict{Kind: Jump, Chain: e.Chain}, true
		}
	}
	return Verdict{}, false
}
