package nft

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Fake is an in-memory kernel table behind a programmer, in the manner of
// knftables' Fake: the same planning as the kernel's Programmer, its steps
// applied to tables in memory, all or nothing per transaction, and refused
// where the kernel would refuse them: a rule or element naming a chain or
// set that is not there, a set of the wrong kind for its lookup (a verdict
// map for a vmap, a data map for a map, a dynamic set for an update), a set
// or chain deleted while something refers to it, an element added twice
// with different values or deleted while absent, a set filled past its
// size. A feature's sync logic is so tested without root, and a failing
// test prints the table as `nft` text (Dump). As a Programmer, a Fake is
// not for concurrent use.
type Fake struct {
	*Programmer
	k *fakeKernel
}

var _ Syncer = (*Fake)(nil)

// NewFake is a fake kernel without the table, and its programmer.
func NewFake(table TableID) *Fake {
	k := &fakeKernel{id: table}
	return &Fake{Programmer: &Programmer{id: table, k: k}, k: k}
}

// Dump is the fake kernel's table as `nft` input text (Table.Dump), "" if
// it has none. Sets are listed under the desired names they stand for, so
// after a sync the dump equals the desired table's.
func (f *Fake) Dump() string {
	t := f.k.view(true)
	if t == nil {
		return ""
	}
	return t.Dump()
}

// Steps are the steps the last sync sent, in order, as "add set S", "add
// S" (elements), "delete S" (elements), "rewrite C", "add chain C", "flush
// chain C", "delete set S", "delete chain C", "add table".
func (f *Fake) Steps() []string { return slices.Clone(f.k.steps) }

// Fail makes the next transaction fail with err, as the kernel refusing it.
func (f *Fake) Fail(err error) { f.k.fail = err }

// Edit changes the fake kernel's table as someone else would (nft from a
// shell): fn gets the table, sets under their kernel names, or nil if
// there is none, and returns it changed, or nil to delete it. The next
// full sync reads the table back and repairs it.
func (f *Fake) Edit(fn func(t *Table) *Table) {
	k := f.k
	t := fn(k.view(false))
	k.foreign = true
	if t == nil {
		k.t = nil
		return
	}
	old := k.t
	k.t = newFakeTable()
	for name, c := range t.Chains {
		k.t.chains[name] = &fakeChain{base: c.Base, rules: slices.Clone(c.Rules)}
	}
	for name, s := range t.Sets {
		fs := &fakeSet{spec: s.Spec, elems: map[string]string{}}
		if old != nil && old.sets[name] != nil && sameSpec(old.sets[name].spec, s.Spec) {
			fs.size = old.sets[name].size
		}
		for id := range s.All() {
			fs.elems[ElementKey(id)] = id
		}
		k.t.sets[name] = fs
	}
}

// Resize gives a set of the fake kernel another size, as if another
// version of the programmer had made it: the next full sync reads it back.
func (f *Fake) Resize(kname string, size uint32) {
	if f.k.t != nil && f.k.t.sets[kname] != nil {
		f.k.t.sets[kname].size = size
		f.k.foreign = true
	}
}

// fakeKernel is the table in memory; it is the Fake's kernel and the
// txWriter its plans are sent to.
type fakeKernel struct {
	id      TableID
	t       *fakeTable // nil: no table
	foreign bool       // changed by Edit since the last sync looked
	fail    error
	steps   []string
	// tx is the transaction being applied: a copy of t, or of nothing
	// (txSet) when the table is deleted.
	tx     *fakeTable
	txSet  bool
	txErr  error
	counts fakeCounts
}

type fakeTable struct {
	chains map[string]*fakeChain
	sets   map[string]*fakeSet // by kernel name
}

type fakeChain struct {
	base  *Hook
	rules []Rule // their expressions read sets under kernel names
}

type fakeSet struct {
	spec  SetSpec
	size  uint32
	elems map[string]string // key → id
}

func newFakeTable() *fakeTable {
	return &fakeTable{chains: map[string]*fakeChain{}, sets: map[string]*fakeSet{}}
}

func (t *fakeTable) clone() *fakeTable {
	if t == nil {
		return nil
	}
	out := newFakeTable()
	for name, c := range t.chains {
		out.chains[name] = &fakeChain{base: c.base, rules: slices.Clone(c.rules)}
	}
	for name, s := range t.sets {
		out.sets[name] = &fakeSet{spec: s.spec, size: s.size, elems: maps.Clone(s.elems)}
	}
	return out
}

// view is the table as a Table: sets under the desired names they stand
// for (logical), or under their kernel names.
func (k *fakeKernel) view(logical bool) *Table {
	if k.t == nil {
		return nil
	}
	out := NewTable(k.id.Family, k.id.Name)
	for name, c := range k.t.chains {
		out.Chains[name] = &Chain{Name: name, Base: c.base, Rules: slices.Clone(c.rules)}
	}
	for _, kname := range sortedKeys(k.t.sets) {
		s, name := k.t.sets[kname], kname
		if logical && out.Sets[logicalName(kname)] == nil {
			name = logicalName(kname)
		}
		set := &Set{Name: name, Spec: s.spec, Elements: make(map[string]uint32, len(s.elems))}
		for _, id := range s.elems {
			set.Elements[id] = 1
		}
		out.Sets[name] = set
	}
	return out
}

func (k *fakeKernel) connect() (bool, error) { return false, nil }

func (k *fakeKernel) changed(TableID) *foreign {
	c := k.foreign
	k.foreign = false
	if !c {
		return nil
	}
	return &foreign{all: true} // Edit may change anything
}

func (k *fakeKernel) reread(TableID, *kernelTable, *foreign) (int, error) { return 0, nil }

func (k *fakeKernel) readBack(TableID) (*kernelTable, error) {
	if k.t == nil {
		return nil, nil
	}
	kt := newKernelTable()
	for name, c := range k.t.chains {
		fps := make([]string, len(c.rules))
		for i, r := range c.rules {
			fps[i] = r.FP
		}
		kt.chains[name] = &kernelChain{base: c.base, rules: fps}
	}
	for kname, s := range k.t.sets {
		ks := &kernelSet{spec: s.spec, name: kname, size: s.size}
		if !s.spec.Dynamic {
			ks.elems.m = make(map[string]uint32, len(s.elems))
			for _, id := range s.elems {
				ks.elems.m[id] = 1
			}
		}
		kt.addReadSet(ks)
	}
	return kt, nil
}

func (k *fakeKernel) send(p *plan) (Stats, error) {
	k.steps = k.steps[:0]
	return p.send(k)
}

func (k *fakeKernel) reset() { k.discard() }
func (k *fakeKernel) close() {}

func (k *fakeKernel) discard() { k.tx, k.txSet, k.txErr = nil, false, nil }

func (k *fakeKernel) queue() error {
	err := k.txErr
	if k.fail != nil {
		err, k.fail = k.fail, nil
	}
	if err == nil {
		k.t = k.tx
	}
	k.discard()
	return err
}

func (k *fakeKernel) wait() error { return nil }

// add applies a step to the transaction, keeping its first refusal for
// queue, as the kernel answers a batch.
func (k *fakeKernel) add(p *plan, s *step) error {
	if !k.txSet {
		k.tx, k.txSet = k.t.clone(), true
	}
	k.steps = append(k.steps, s.label())
	if k.txErr == nil {
		if err := k.apply(p, s); err != nil {
			k.txErr = fmt.Errorf("%s: %w", s.label(), err)
		}
	}
	return nil
}

func (k *fakeKernel) apply(p *plan, s *step) error {
	switch s.op {
	case opAddTable:
		if k.tx == nil {
			k.tx = newFakeTable()
		}
		return nil
	case opDelTable:
		if k.tx == nil {
			return unix.ENOENT
		}
		k.tx = nil
		return nil
	}
	t := k.tx
	if t == nil {
		return fmt.Errorf("no table %s: %w", k.id, unix.ENOENT)
	}
	switch s.op {
	case opAddSet:
		if old := t.sets[s.name]; old != nil && (!sameSpec(old.spec, *s.spec) || old.size != s.size) {
			return fmt.Errorf("set %s exists, of another kind: %w", s.name, unix.EEXIST)
		}
		if t.sets[s.name] == nil {
			t.sets[s.name] = &fakeSet{spec: *s.spec, size: s.size, elems: map[string]string{}}
		}
	case opAddChain:
		if old := t.chains[s.chain.Name]; old != nil && !sameBase(old.base, s.chain.Base) {
			return fmt.Errorf("chain %s exists with another hook: %w", s.chain.Name, unix.EEXIST)
		}
		if t.chains[s.chain.Name] == nil {
			t.chains[s.chain.Name] = &fakeChain{base: s.chain.Base}
		}
	case opRewrite:
		return t.rewrite(p, s)
	case opElements:
		return t.elements(s)
	case opFlushChain:
		c := t.chains[s.name]
		if c == nil {
			return fmt.Errorf("chain %s: %w", s.name, unix.ENOENT)
		}
		c.rules = nil
	case opDelSet:
		return remove(t.sets, "set", s.name, t.readerOf)
	case opDelChain:
		return remove(t.chains, "chain", s.name, t.referrerOf)
	}
	return nil
}

// remove deletes a set or chain, unless it is missing or user finds
// something that uses it.
func remove[V any](m map[string]V, kind, name string, user func(string) string) error {
	if _, ok := m[name]; !ok {
		return fmt.Errorf("%s %s: %w", kind, name, unix.ENOENT)
	}
	if by := user(name); by != "" {
		return fmt.Errorf("%s %s is used by %s: %w", kind, name, by, unix.EBUSY)
	}
	delete(m, name)
	return nil
}

// rewrite replaces a chain's rules, checking what each refers to.
func (t *fakeTable) rewrite(p *plan, s *step) error {
	c := t.chains[s.chain.Name]
	if c == nil {
		return fmt.Errorf("chain %s: %w", s.chain.Name, unix.ENOENT)
	}
	if s.rebase {
		c.base = s.chain.Base
	}
	if s.flush {
		c.rules = nil
	}
	for _, rl := range s.chain.Rules {
		rl.Exprs = renamed(rl.Exprs, p.names)
		if err := t.checkRule(rl); err != nil {
			return fmt.Errorf("chain %s, rule %q: %w", s.chain.Name, rl.Text, err)
		}
		c.rules = append(c.rules, rl)
	}
	return nil
}

// checkRule checks that the chains and sets a rule names are there and
// of the kind its expressions need.
func (t *fakeTable) checkRule(rl Rule) error {
	for _, e := range rl.Exprs {
		switch e := e.(type) {
		case *expr.Lookup:
			if e.SetName == AnonSetName {
				if rl.Anon == nil {
					return errors.New("a lookup of an anonymous set the rule lacks")
				}
				for _, el := range rl.Anon.Elements {
					if err := t.checkTarget(el.VerdictData); err != nil {
						return err
					}
				}
				continue
			}
			s := t.sets[e.SetName]
			switch {
			case s == nil:
				return fmt.Errorf("set %s: %w", e.SetName, unix.ENOENT)
			case e.IsDestRegSet && e.DestRegister == unix.NFT_REG_VERDICT && !s.spec.isVerdictMap():
				return fmt.Errorf("vmap lookup of %s, not a verdict map: %w", e.SetName, unix.EINVAL)
			case e.IsDestRegSet && e.DestRegister != unix.NFT_REG_VERDICT && (!s.spec.IsMap() || s.spec.isVerdictMap()):
				return fmt.Errorf("map lookup of %s, not a data map: %w", e.SetName, unix.EINVAL)
			}
		case *expr.Dynset:
			switch s := t.sets[e.SetName]; {
			case s == nil:
				return fmt.Errorf("set %s: %w", e.SetName, unix.ENOENT)
			case !s.spec.Dynamic:
				return fmt.Errorf("update of %s, not a dynamic set: %w", e.SetName, unix.EOPNOTSUPP)
			}
		case *expr.Verdict:
			if err := t.checkTarget(e); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkTarget checks that a jump or goto leads to a regular chain.
func (t *fakeTable) checkTarget(v *expr.Verdict) error {
	if v == nil || (v.Kind != expr.VerdictJump && v.Kind != expr.VerdictGoto) {
		return nil
	}
	switch c := t.chains[v.Chain]; {
	case c == nil:
		return fmt.Errorf("%s to chain %s: %w", verdictText(v), v.Chain, unix.ENOENT)
	case c.base != nil:
		return fmt.Errorf("%s to base chain %s: %w", verdictText(v), v.Chain, unix.EOPNOTSUPP)
	}
	return nil
}

// elements adds or deletes a step's elements.
func (t *fakeTable) elements(s *step) error {
	set := t.sets[s.name]
	if set == nil {
		return fmt.Errorf("set %s: %w", s.name, unix.ENOENT)
	}
	for _, id := range s.ids {
		key := ElementKey(id)
		old, ok := set.elems[key]
		switch {
		case s.del && !ok:
			return fmt.Errorf("set %s has no element %s: %w", s.name, ElementText(id, set.spec), unix.ENOENT)
		case s.del:
			delete(set.elems, key)
		case ok && old != id:
			return fmt.Errorf("set %s has %s, not %s: %w", s.name, ElementText(old, set.spec), ElementText(id, set.spec), unix.EEXIST)
		default:
			if set.spec.isVerdictMap() {
				if err := t.checkTarget(DecodeElement(id, set.spec).VerdictData); err != nil {
					return err
				}
			}
			set.elems[key] = id
		}
	}
	if set.size > 0 && len(set.elems) > int(set.size) {
		return fmt.Errorf("set %s of size %d would hold %d elements: %w", s.name, set.size, len(set.elems), unix.ENFILE)
	}
	return nil
}

// readerOf names a chain with a rule reading the set, or is "".
func (t *fakeTable) readerOf(set string) string {
	for _, name := range sortedKeys(t.chains) {
		for _, rl := range t.chains[name].rules {
			if slices.Contains(setsRead(rl), set) {
				return "a rule of chain " + name
			}
		}
	}
	return ""
}

// referrerOf says what leads to the chain (a rule's jump or goto, or a
// verdict map's element), or "".
func (t *fakeTable) referrerOf(chain string) string {
	leads := func(v *expr.Verdict) bool {
		return v != nil && (v.Kind == expr.VerdictJump || v.Kind == expr.VerdictGoto) && v.Chain == chain
	}
	for name, c := range t.chains {
		for _, rl := range c.rules {
			for _, e := range rl.Exprs {
				if v, ok := e.(*expr.Verdict); ok && leads(v) {
					return "a rule of chain " + name
				}
			}
			if rl.Anon != nil {
				for _, el := range rl.Anon.Elements {
					if leads(el.VerdictData) {
						return "a rule of chain " + name
					}
				}
			}
		}
	}
	for name, s := range t.sets {
		if !s.spec.isVerdictMap() {
			continue
		}
		for _, id := range s.elems {
			if leads(DecodeElement(id, s.spec).VerdictData) {
				return "an element of map " + name
			}
		}
	}
	return ""
}
