package proxy

import (
	"encoding/binary"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// TableName is the name of netplane's table in both the ip and ip6 families.
// Nothing outside these two tables is ever touched.
const TableName = "netplane"

// Table is one family's desired (or observed) nftables table as typed
// values: what the renderer programs and what the golden tests compare.
type Table struct {
	Family nftables.TableFamily
	Chains map[string]*Chain
	Sets   map[string]*Set
	// shared, in a Service's fragment, collects the elements it adds to
	// shared sets (merged into the model's sets later) instead of a map
	// per set and Service: at start-up those maps were a fifth of a
	// build's allocations.
	shared *[]fragElem
}

func newTable(fam nftables.TableFamily) *Table {
	return &Table{Family: fam, Chains: map[string]*Chain{}, Sets: map[string]*Set{}}
}

// Hook makes a chain a base chain.
type Hook struct {
	Type     nftables.ChainType
	Hook     nftables.ChainHook
	Priority int32
}

// Chain is a chain and its rules in order.
type Chain struct {
	Name  string
	Base  *Hook
	Rules []Rule
	// Shared: one chain serves many Services (pickChain); the model keeps
	// it while any Service uses it. Never modified once built.
	Shared bool
}

// Rule is one rule: its nft text (for dumps, diffs and the fingerprint kept
// in the kernel) and the expressions that implement it.
type Rule struct {
	Text  string
	FP    string // fingerprint of Text, stored in the kernel rule's comment
	Exprs []expr.Any
	// Anon is an anonymous constant set the rule looks up; its Lookup
	// expression names anonSetName and gets the real id when rendered.
	Anon *AnonSet
}

// anonSetName marks the Lookup of a rule's anonymous set in Rule.Exprs.
const anonSetName = "@anon"

// AnonSet is the constant set of one rule.
type AnonSet struct {
	Key      nftables.SetDatatype
	Data     nftables.SetDatatype // zero for a plain set
	Interval bool
	Elements []nftables.SetElement
}

// SetSpec is the shape of a named set or map.
type SetSpec struct {
	Key     nftables.SetDatatype
	Data    nftables.SetDatatype // nftables.TypeVerdict for a verdict map, zero for a set
	Dynamic bool                 // elements are added by the packet path (affinity)
	Timeout time.Duration
}

func (s SetSpec) isMap() bool { return s.Data.Name != "" }

// Set is a named set or map with its elements by id (Element.id). The
// value counts the Services adding the element (in the merged tables; 1 in
// a Service's own): two may add the same one, an endpoint's hairpin pair.
// Only ids are kept, the element's one allocation: at 10,000 Services the
// sets hold over 200,000 elements.
type Set struct {
	Name     string
	Spec     SetSpec
	Elements map[string]uint32
	// programmed: the renderer's record of the kernel shares Elements
	// (Renderer.adopt), so it must be copied before it changes (mutable).
	programmed bool
}

// mutable is the set's Elements, copied first if the renderer's record
// shares them: the model changes its merged sets in place, and a record
// that shared a changed map would believe the kernel already had it.
func (s *Set) mutable() map[string]uint32 {
	if s.programmed {
		s.Elements, s.programmed = maps.Clone(s.Elements), false
	}
	return s.Elements
}

// Element is one element of a named set or map, as built.
type Element struct {
	Key     []byte
	Val     []byte
	Verdict *expr.Verdict
}

// id identifies an element with its value, so a changed value is a delete
// of the old element and an add of the new: the key's length, the key, then
// the value or the verdict's code and chain, as raw bytes. It is computed
// for every element of every build and read-back (100,000 at 10,000
// Services), so it is one allocation.
func (e Element) id() string {
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

// elementKey is the key part of an element id.
func elementKey(id string) string { return id[:1+int(id[0])] }

// decodeElement is the element an id of a set of spec stands for.
func decodeElement(id string, spec SetSpec) nftables.SetElement {
	n := int(id[0])
	e := nftables.SetElement{Key: []byte(id[1 : 1+n])}
	rest := id[1+n:]
	switch {
	case spec.Data.Name == nftables.TypeVerdict.Name && len(rest) >= 4:
		e.VerdictData = &expr.Verdict{Kind: expr.VerdictKind(int32(binary.BigEndian.Uint32([]byte(rest[:4])))), Chain: rest[4:]}
	case spec.isMap():
		e.Val = []byte(rest)
	}
	return e
}

// elementText is an element as nft prints it: the key's fields by the
// set's types, then the verdict.
func elementText(id string, spec SetSpec) string {
	e := decodeElement(id, spec)
	text := fieldsText(e.Key, spec.Key)
	switch {
	case e.VerdictData != nil:
		text += " : " + verdictText(e.VerdictData)
	case spec.isMap():
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
			parts = append(parts, protoName(b[0]))
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

func (t *Table) set(name string, spec SetSpec) *Set {
	s := t.Sets[name]
	if s == nil {
		s = &Set{Name: name, Spec: spec, Elements: map[string]uint32{}}
		t.Sets[name] = s
	}
	return s
}

// addElement adds e to a set, declaring a shared set on first use (a
// Service's fragment holds only the sets it adds to).
func (t *Table) addElement(set string, e Element) { t.addElementID(set, e.id()) }

// addElementID is addElement of an element given by its id.
func (t *Table) addElementID(set, id string) {
	if _, ok := sharedSets[t.Family][set]; ok && t.shared != nil {
		*t.shared = append(*t.shared, fragElem{set, id})
		return
	}
	s := t.Sets[set]
	if s == nil {
		s = t.set(set, sharedSets[t.Family][set])
	}
	s.mutable()[id] = 1
}

func (t *Table) chain(name string, base *Hook) *Chain {
	c := t.Chains[name]
	if c == nil {
		c = &Chain{Name: name, Base: base}
		t.Chains[name] = c
	}
	return c
}

// useShared adds a shared chain, built once for every Service using it.
func (t *Table) useShared(c *Chain) { t.Chains[c.Name] = c }

func (t *Table) addRule(chain string, r Rule) {
	c := t.Chains[chain]
	c.Rules = append(c.Rules, r)
}

func familyName(f nftables.TableFamily) string {
	if f == nftables.TableFamilyIPv6 {
		return "ip6"
	}
	return "ip"
}

var hookNames = map[nftables.ChainHook]string{
	*nftables.ChainHookPrerouting:  "prerouting",
	*nftables.ChainHookInput:       "input",
	*nftables.ChainHookForward:     "forward",
	*nftables.ChainHookOutput:      "output",
	*nftables.ChainHookPostrouting: "postrouting",
}

// Dump renders the table as `nft` input lines in a stable order (table,
// chains, sets and maps, elements by set, rules in chain order), in the
// manner of knftables' fake, so a failing test reads like a ruleset diff.
func (t *Table) Dump() string {
	fam := familyName(t.Family)
	var b strings.Builder
	fmt.Fprintf(&b, "add table %s %s\n", fam, TableName)
	for _, name := range sortedKeys(t.Chains) {
		c := t.Chains[name]
		if c.Base != nil {
			fmt.Fprintf(&b, "add chain %s %s %s { type %s hook %s priority %d ; }\n",
				fam, TableName, name, c.Base.Type, hookNames[c.Base.Hook], c.Base.Priority)
		} else {
			fmt.Fprintf(&b, "add chain %s %s %s\n", fam, TableName, name)
		}
	}
	for _, name := range sortedKeys(t.Sets) {
		s := t.Sets[name]
		kind, typ := "set", s.Spec.Key.Name
		if s.Spec.isMap() {
			kind, typ = "map", typ+" : "+s.Spec.Data.Name
		}
		flags := ""
		if s.Spec.Dynamic {
			flags = fmt.Sprintf(" flags dynamic,timeout ; timeout %ds ;", int(s.Spec.Timeout.Seconds()))
		}
		fmt.Fprintf(&b, "add %s %s %s %s { type %s ;%s }\n", kind, fam, TableName, name, typ, flags)
	}
	for _, name := range sortedKeys(t.Sets) {
		s := t.Sets[name]
		texts := make([]string, 0, len(s.Elements))
		for id := range s.Elements {
			texts = append(texts, elementText(id, s.Spec))
		}
		sort.Strings(texts)
		for _, e := range texts {
			fmt.Fprintf(&b, "add element %s %s %s { %s }\n", fam, TableName, name, e)
		}
	}
	for _, name := range sortedKeys(t.Chains) {
		for _, r := range t.Chains[name].Rules {
			fmt.Fprintf(&b, "add rule %s %s %s %s\n", fam, TableName, name, r.Text)
		}
	}
	return b.String()
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
