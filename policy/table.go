package policy

import (
	"fmt"
	"iter"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"go4.org/netipx"

	"github.com/netplane/netplane/nft"
	"github.com/netplane/netplane/nodeview"
)

// TableName is the inet table policy owns; nothing outside it is touched.
const TableName = "netplane-policy"

// AnyFamily is the Family of a rule that reads no address.
const AnyFamily nodeview.Family = 0

// suffix names a set's twin of the family: "" for IPv4, "6" for IPv6.
func suffix(f nodeview.Family) string {
	if f == nodeview.IPv6 {
		return "6"
	}
	return ""
}

// word is the family's payload expression in nft's words.
func word(f nodeview.Family) string {
	if f == nodeview.IPv6 {
		return "ip6"
	}
	return "ip"
}

func addrType(f nodeview.Family) string {
	if f == nodeview.IPv6 {
		return "ipv6_addr"
	}
	return "ipv4_addr"
}

// Table is the desired content of the inet table: what a renderer
// programs and what tests compare. Chains and sets are keyed by name.
type Table struct {
	Chains   map[string]*Chain
	Sets     map[string]*Set
	Counters []string // named counter objects
}

// Hook makes a chain a base chain (type filter, policy accept).
type Hook struct {
	Hook     string // "forward", "input"
	Priority int
}

// Chain is a chain and its rules in order. A chain is never changed once
// in the table: a change is a chain of another name.
type Chain struct {
	Name  string
	Base  *Hook
	Rules []Rule
}

// Field is the address a rule reads.
type Field uint8

const (
	Saddr Field = iota + 1
	Daddr
)

func (f Field) String() string {
	if f == Daddr {
		return "daddr"
	}
	return "saddr"
}

// VerdictKind is what a rule does when it matches.
type VerdictKind uint8

const (
	NoVerdict VerdictKind = iota // the rule only counts or logs
	Accept
	Drop
	Return
	Jump
	Goto
)

// Verdict is a rule's or a map element's verdict.
type Verdict struct {
	Kind  VerdictKind
	Chain string // for Jump and Goto
}

func (v Verdict) String() string {
	switch v.Kind {
	case Accept:
		return "accept"
	case Drop:
		return "drop"
	case Return:
		return "return"
	case Jump:
		return "jump " + v.Chain
	case Goto:
		return "goto " + v.Chain
	}
	return ""
}

// Log is an NFLOG statement, rate-limited; the zero value logs nothing.
type Log struct {
	Group  uint16
	Rate   uint32 // packets per second
	Prefix string
}

// Rule is one rule: a conjunction of the matches that are set, in the
// order of the fields, then the statements and the verdict. It is the
// handful of forms policy needs, each one nft expression sequence.
type Rule struct {
	Established bool // ct state established,related
	// NeighborDiscovery: ICMPv6 router and neighbour solicitations and
	// advertisements, which conntrack does not track.
	NeighborDiscovery bool
	Family            nodeview.Family // of the address read by Set, PortSet or Vmap
	Field             Field           // the address Set and Vmap read
	Set               string          // the address is in this named set (AddrSet, RangeSet)
	Proto             uint8           // meta l4proto; 0 for any
	// PortFrom..PortTo: th dport in this range (Proto is set); 0 for any.
	PortFrom, PortTo uint16
	PortSet          string // daddr . l4proto . th dport is in this named set
	Vmap             string // the address looked up in this verdict map
	Counter          string // named counter
	Log              Log
	Verdict          Verdict
}

// Text is the rule as nft reads it.
func (r Rule) Text() string {
	var parts []string
	if r.Established {
		parts = append(parts, "ct state established,related")
	}
	if r.NeighborDiscovery {
		parts = append(parts, "icmpv6 type { nd-router-solicit, nd-router-advert, nd-neighbor-solicit, nd-neighbor-advert }")
	}
	if r.Set != "" {
		parts = append(parts, fmt.Sprintf("%s %s @%s", word(r.Family), r.Field, r.Set))
	}
	if r.Proto != 0 {
		parts = append(parts, "meta l4proto "+nft.ProtoName(r.Proto))
	}
	if r.PortFrom != 0 {
		p := strconv.Itoa(int(r.PortFrom))
		if r.PortTo != r.PortFrom {
			p += "-" + strconv.Itoa(int(r.PortTo))
		}
		parts = append(parts, "th dport "+p)
	}
	if r.PortSet != "" {
		parts = append(parts, fmt.Sprintf("%s daddr . meta l4proto . th dport @%s", word(r.Family), r.PortSet))
	}
	if r.Vmap != "" {
		parts = append(parts, fmt.Sprintf("%s %s vmap @%s", word(r.Family), r.Field, r.Vmap))
	}
	if r.Counter != "" {
		parts = append(parts, "counter name "+strconv.Quote(r.Counter))
	}
	if r.Log.Rate != 0 {
		parts = append(parts, fmt.Sprintf("limit rate %d/second log prefix %s group %d", r.Log.Rate, strconv.Quote(r.Log.Prefix), r.Log.Group))
	}
	if v := r.Verdict.String(); v != "" {
		parts = append(parts, v)
	}
	return strings.Join(parts, " ")
}

// SetKind is the shape of a named set's elements.
type SetKind uint8

const (
	AddrSet          SetKind = iota + 1 // addresses
	RangeSet                            // address ranges (flags interval)
	AddrProtoPortSet                    // address . protocol . port
	AddrVerdictMap                      // address : verdict
)

// Set is a named set or verdict map of one family. An explicit set counts
// the reasons each element is there (two pods with one address); the
// kernel holds it while any is left. A peer selector's sets derive theirs
// from the selector's members (members.go).
type Set struct {
	Name   string
	Family nodeview.Family
	Kind   SetKind
	elems  map[Element]int // explicit elements; nil when from is set
	from   derived
}

// Has reports whether e is an element of s.
func (s *Set) Has(e Element) bool {
	if s.from != nil {
		return s.from.has(e)
	}
	return s.elems[e] > 0
}

// All yields each element of s once, in no order.
func (s *Set) All() iter.Seq[Element] {
	if s.from != nil {
		return s.from.each
	}
	return func(yield func(Element) bool) {
		for e := range s.elems {
			if !yield(e) {
				return
			}
		}
	}
}

// Len is the number of elements of s.
func (s *Set) Len() int {
	if s.from == nil {
		return len(s.elems)
	}
	n := 0
	for range s.from.each {
		n++
	}
	return n
}

// Element is one element of a named set, whichever its kind: Addr alone
// (AddrSet), Addr..End (RangeSet), Addr . Proto . Port (AddrProtoPortSet),
// Addr : jump Chain (AddrVerdictMap). Comparable: it is its own id.
type Element struct {
	Addr, End netip.Addr
	Proto     uint8
	Port      uint16
	Chain     string
}

// sizeHint is about the number of elements of s, without counting them.
func (s *Set) sizeHint() int {
	if s.from != nil {
		return s.from.size()
	}
	return len(s.elems)
}

func newSet(name string, fam nodeview.Family, kind SetKind) *Set {
	return &Set{Name: name, Family: fam, Kind: kind, elems: map[Element]int{}}
}

func derivedSet(name string, fam nodeview.Family, kind SetKind, from derived) *Set {
	return &Set{Name: name, Family: fam, Kind: kind, from: from}
}

func (s *Set) typeText() string {
	switch s.Kind {
	case RangeSet:
		return "type " + addrType(s.Family) + " ; flags interval ;"
	case AddrProtoPortSet:
		return "type " + addrType(s.Family) + " . inet_proto . inet_service ;"
	case AddrVerdictMap:
		return "type " + addrType(s.Family) + " : verdict ;"
	}
	return "type " + addrType(s.Family) + " ;"
}

// ElementText is an element as nft prints it in a set of this kind.
func (s *Set) ElementText(e Element) string {
	switch s.Kind {
	case RangeSet:
		if e.Addr == e.End {
			return e.Addr.String()
		}
		if p, ok := netipx.IPRangeFrom(e.Addr, e.End).Prefix(); ok {
			return p.String()
		}
		return e.Addr.String() + "-" + e.End.String()
	case AddrProtoPortSet:
		return fmt.Sprintf("%s . %s . %d", e.Addr, nft.ProtoName(e.Proto), e.Port)
	case AddrVerdictMap:
		return e.Addr.String() + " : jump " + e.Chain
	}
	return e.Addr.String()
}

// Dump renders the table as `nft -f` input in a stable order (table,
// chains, sets and maps, counters, elements, rules), as knftables' fake
// does, so a failing test reads like a ruleset diff.
func (t *Table) Dump() string {
	var b strings.Builder
	prefix := "inet " + TableName + " "
	b.WriteString("add table inet " + TableName + "\n")
	chains := sortedKeys(t.Chains)
	for _, name := range chains {
		if h := t.Chains[name].Base; h != nil {
			fmt.Fprintf(&b, "add chain %s%s { type filter hook %s priority %d ; policy accept ; }\n", prefix, name, h.Hook, h.Priority)
		} else {
			fmt.Fprintf(&b, "add chain %s%s\n", prefix, name)
		}
	}
	sets := sortedKeys(t.Sets)
	for _, name := range sets {
		s := t.Sets[name]
		kind := "set"
		if s.Kind == AddrVerdictMap {
			kind = "map"
		}
		fmt.Fprintf(&b, "add %s %s%s { %s }\n", kind, prefix, name, s.typeText())
	}
	for _, c := range slices.Sorted(slices.Values(t.Counters)) {
		fmt.Fprintf(&b, "add counter %s%s\n", prefix, c)
	}
	for _, name := range sets {
		s := t.Sets[name]
		var texts []string
		for e := range s.All() {
			texts = append(texts, s.ElementText(e))
		}
		slices.Sort(texts)
		for _, e := range texts {
			fmt.Fprintf(&b, "add element %s%s { %s }\n", prefix, name, e)
		}
	}
	for _, name := range chains {
		for _, r := range t.Chains[name].Rules {
			fmt.Fprintf(&b, "add rule %s%s %s\n", prefix, name, r.Text())
		}
	}
	return b.String()
}

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }
