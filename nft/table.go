// Package nft is netplane's nftables driver. It owns the typed objects a
// feature describes its table with (table, chain, rule, set and map with
// their elements), the element-id codec, a builder of rule statements, and
// the programmer that converges one kernel table to a desired one: reading
// it back and adopting it, sending only the difference in transactions that
// make before they break, healing what others changed (seen by a monitor of
// the kernel's nftables notifications), plus a text dump and an in-memory
// fake with the programmer's interface, so that a feature's sync logic is
// tested without root.
//
// It exists because neither library fits a table of 10,000 Services:
// google/nftables alone asks the kernel to acknowledge every message and
// allocates several buffers per set element, and knftables goes through the
// `nft` binary, which a netplane node may not have. So google/nftables
// encodes chains and rules here, and this package sends them, encodes and
// decodes set elements itself, and reads tables back with its own dumps.
//
// The layering is one way: features (the Service proxy, NetworkPolicy, the
// CNI's hostPort and masquerade tables) → nft → google/nftables. Nothing
// here knows what a Service or a policy is.
package nft

import (
	"iter"
	"maps"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// TableID names one table: its family and name. Nothing outside the tables
// a programmer is given is ever touched.
type TableID struct {
	Family nftables.TableFamily
	Name   string
}

func (id TableID) String() string { return familyName(id.Family) + " " + id.Name }

// Table is one desired (or observed) nftables table as typed values: what a
// programmer converges the kernel to and what golden tests compare.
type Table struct {
	Family nftables.TableFamily
	Name   string
	Chains map[string]*Chain
	Sets   map[string]*Set
}

// NewTable is an empty table.
func NewTable(family nftables.TableFamily, name string) *Table {
	return &Table{Family: family, Name: name, Chains: map[string]*Chain{}, Sets: map[string]*Set{}}
}

// ID is the table's family and name.
func (t *Table) ID() TableID { return TableID{t.Family, t.Name} }

// Hook makes a chain a base chain.
type Hook struct {
	Type     nftables.ChainType
	Hook     nftables.ChainHook
	Priority int32
}

// Chain is a chain and its rules in order. A programmer never changes a
// chain it is given, so one Chain value may serve several tables.
type Chain struct {
	Name  string
	Base  *Hook
	Rules []Rule
}

// Rule is one rule: its nft text (for dumps, diffs and the fingerprint kept
// in the kernel) and the expressions that implement it (RuleBuilder makes
// both from the same statements). Expressions are never changed once
// built, so rules may share them.
type Rule struct {
	Text  string
	FP    string // Fingerprint of Text, stored in the kernel rule's comment
	Exprs []expr.Any
	// Anon is an anonymous constant set the rule looks up; its Lookup
	// expression names AnonSetName and gets the real name when sent.
	Anon *AnonSet
}

// AnonSetName marks the Lookup of a rule's anonymous set in Rule.Exprs.
const AnonSetName = "@anon"

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
	Dynamic bool                 // elements are added by the packet path (dynset)
	Timeout time.Duration
}

// IsMap says whether the set maps its keys to data or verdicts.
func (s SetSpec) IsMap() bool { return s.Data.Name != "" }

func (s SetSpec) isVerdictMap() bool { return s.Data.Name == nftables.TypeVerdict.Name }

func sameSpec(a, b SetSpec) bool {
	return a.Data.Name == b.Data.Name && a.Dynamic == b.Dynamic && a.Timeout == b.Timeout
}

// Set is a named set or map with its elements by id (element.go). Only ids
// are kept, one allocation per element: the proxy's sets hold over 200,000
// at 10,000 Services. The programmer reads only the keys; the value is the
// table builder's own (the proxy counts the Services adding each element).
// A dynamic set's elements are the packet path's: the programmer creates
// the set and leaves them alone.
//
// After a successful sync the programmer keeps the elements as its record
// of the kernel instead of a copy (at 10,000 Services a copy was a seventh
// of the proxy's live heap), and marks the set adopted. A set not changed
// through Mutable since the sync before (or made whole by its builder for
// this one) is packed then (packed.go): Elements is nil. So the elements are read through Len, Value and All, and changed
// only through Mutable, which first gives the set a map of its own: a
// record sharing a changed map would believe the kernel already had the
// change. A table builder may fill Elements of a set it has just made.
type Set struct {
	Name     string
	Spec     SetSpec
	Elements map[string]uint32
	packed   *packed
	adopted  bool
	changed  bool // Mutable was called since the last adoption
}

// Mutable is the set's elements as a map to be changed in place: copied
// first if a programmer adopted them (see Set).
func (s *Set) Mutable() map[string]uint32 {
	switch {
	case s.packed != nil:
		s.Elements, s.packed = s.packed.thaw(), nil
	case s.adopted:
		s.Elements = maps.Clone(s.Elements)
	}
	s.adopted, s.changed = false, true
	if s.Elements == nil {
		s.Elements = map[string]uint32{}
	}
	return s.Elements
}

// Len is the number of elements.
func (s *Set) Len() int { return s.elems().len() }

// Value is the value of element id, 0 if the set lacks it.
func (s *Set) Value(id string) uint32 {
	v, _ := s.elems().get(id)
	return v
}

// All is every element with its value.
func (s *Set) All() iter.Seq2[string, uint32] { return s.elems().all() }

func (s *Set) elems() elems { return elems{m: s.Elements, p: s.packed} }

// adopt marks the set's elements as the programmer's record and returns
// them, packed unless Mutable changed them since the sync before.
func (s *Set) adopt() elems {
	if !s.changed && s.packed == nil && len(s.Elements) > 0 {
		s.packed, s.Elements = pack(s.Elements), nil
	}
	s.adopted, s.changed = true, false
	return s.elems()
}

// Set is the named set, declared with spec if it is not there yet.
func (t *Table) Set(name string, spec SetSpec) *Set {
	s := t.Sets[name]
	if s == nil {
		s = &Set{Name: name, Spec: spec, Elements: map[string]uint32{}}
		t.Sets[name] = s
	}
	return s
}

// Chain is the named chain, added (a base chain if base is set) if it is
// not there yet.
func (t *Table) Chain(name string, base *Hook) *Chain {
	c := t.Chains[name]
	if c == nil {
		c = &Chain{Name: name, Base: base}
		t.Chains[name] = c
	}
	return c
}

// AddRule appends a rule to an existing chain.
func (t *Table) AddRule(chain string, r Rule) {
	c := t.Chains[chain]
	c.Rules = append(c.Rules, r)
}

// Touched names the parts of a table that may have changed since the last
// sync: chains, sets (their spec and, for dynamic ones, existence) and
// elements of sets. A partial sync (Programmer.SyncTouched) compares only
// these with what the kernel has, so its cost follows the change, not the
// table.
type Touched struct {
	Chains map[string]bool
	Sets   map[string]bool
	Elems  map[string]map[string]bool // set → element ids
}

// NewTouched names nothing yet.
func NewTouched() *Touched {
	return &Touched{Chains: map[string]bool{}, Sets: map[string]bool{}, Elems: map[string]map[string]bool{}}
}

// Elem records an element of set as touched.
func (tc *Touched) Elem(set, id string) {
	ids := tc.Elems[set]
	if ids == nil {
		ids = map[string]bool{}
		tc.Elems[set] = ids
	}
	ids[id] = true
}

// only is the part of the desired table that touched names.
func (t *Table) only(tc *Touched) *Table {
	out := NewTable(t.Family, t.Name)
	copyNamed(out.Chains, t.Chains, tc.Chains)
	copyNamed(out.Sets, t.Sets, tc.Sets)
	for name, ids := range tc.Elems {
		if s := t.Sets[name]; s != nil {
			out.Sets[name] = &Set{Name: s.Name, Spec: s.Spec, Elements: s.elems().pick(ids)}
		}
	}
	return out
}

// copyNamed copies the entries of src that names lists into dst.
func copyNamed[V any](dst, src map[string]V, names map[string]bool) {
	for name := range names {
		if v, ok := src[name]; ok {
			dst[name] = v
		}
	}
}
