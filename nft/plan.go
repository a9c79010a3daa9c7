package nft

import (
	"errors"
	"fmt"
	"slices"
)

// maxMessages bounds one transaction (in units of about one rule, some
// hundred bytes), so the kernel's nftables mutex is never held long and the
// batch fits the socket buffer.
var maxMessages = 500

// elementsPerMessage is how many set elements go in one netlink message,
// which counts as elementsWeight units of maxMessages.
const (
	elementsPerMessage = 128
	elementsWeight     = 16
)

// plan is the ordered list of changes from what is applied to what is
// wanted: a pure function of the two, which a kernel then sends.
type plan struct {
	applied *kernelTable // the whole record, for the sets' kernel names and sizes
	// steps run in order; a step's messages stay in one transaction.
	steps []step
	// commit updates the programmer's record once every step succeeded; it
	// changes only what changed, so a small change costs little.
	commit []func(*kernelTable)
	// names are the kernel's names of the desired sets that have another
	// (sized.go); renamed are the sets replaced by this plan (or read back
	// under two names), whose readers are rewritten.
	names, renamed map[string]string
	whole          bool // one transaction however big (Replace)
}

func newPlan(applied *kernelTable) *plan { return &plan{applied: applied} }

// errCompareAll: a comparison of part of the table found a set to replace,
// which needs every element.
var errCompareAll = errors.New("a set to replace: compare the whole table")

// op is what a step does.
type op uint8

const (
	opAddTable op = iota + 1
	opDelTable
	opAddSet     // name (the kernel's), spec, size
	opAddChain   // chain
	opRewrite    // chain, its rules replaced: flushed first if flush, deleted and added again if rebase
	opElements   // name (the kernel's), set, spec, ids; deleted if del
	opFlushChain // name
	opDelSet     // name
	opDelChain   // name
)

// step is one change, as data: the programmer sends it over netlink, the
// fake applies it to its tables. A big sync has thousands, so it is kept
// small: no label of its own (label makes one), no closure.
type step struct {
	op                          op
	flush, rebase, del, barrier bool // barrier: start a new transaction after this step
	size                        uint32
	messages, weight            int32 // netlink messages sent; share of maxMessages
	name                        string
	set                         string // opElements: the desired set's name
	spec                        *SetSpec
	chain                       *Chain
	ids                         []string
}

// label names a step, as "add set S", "add S" (elements), "delete S"
// (elements), "rewrite C", "add chain C", "flush chain C", "delete set S",
// "delete chain C", "add table": what Fake.Steps lists.
func (s *step) label() string {
	switch s.op {
	case opAddTable:
		return "add table"
	case opDelTable:
		return "delete table"
	case opAddSet:
		return "add set " + s.name
	case opAddChain:
		return "add chain " + s.chain.Name
	case opRewrite:
		return "rewrite " + s.chain.Name
	case opElements:
		if s.del {
			return "delete " + s.set
		}
		return "add " + s.set
	case opFlushChain:
		return "flush chain " + s.name
	case opDelSet:
		return "delete set " + s.name
	case opDelChain:
		return "delete chain " + s.name
	}
	return fmt.Sprintf("op %d %s", s.op, s.name)
}

func (p *plan) onSuccess(f func(*kernelTable)) { p.commit = append(p.commit, f) }

// add appends a step of one message.
func (p *plan) add(s step) {
	s.messages, s.weight = 1, 1
	p.steps = append(p.steps, s)
}

func (p *plan) barrier() {
	if n := len(p.steps); n > 0 {
		p.steps[n-1].barrier = true
	}
}

// diff plans, in an order the kernel accepts that makes before it breaks,
// so that however a big sync is split into transactions (at the barriers)
// no dispatch leads to a half-written chain or to elements not yet, or no
// longer, there: table, new sets, new (empty) chains; additions and
// replacements in sets and data maps; rewritten chains, whose rules may
// read those new elements; the verdict maps that dispatch, additions first
// and removals after (in the reverse order of the maps' names, so a map
// sorted before another is the first to gain and the last to lose); removals
// from sets and data maps; then flushed and deleted stale chains and sets.
//
// A set replaced by one of another size or spec (sized.go) is created
// with the new sets and filled with the data, verdict maps included; the
// chains reading it are rewritten after all others, and the old set goes
// with the stale ones.
//
// diff fails with errCompareAll, having planned nothing, when a
// comparison of part of the table (whole false) finds a set to replace.
func (p *plan) diff(have *kernelTable, want *Table, created, whole bool) error {
	p.kernelNames(have)
	changes := elementChanges(have, want)
	sets, stale, err := p.setSteps(have, want, changes, whole)
	if err != nil {
		return err
	}
	if created {
		p.add(step{op: opAddTable})
	}
	p.steps = append(p.steps, sets...)
	early := map[string]bool{} // made here, it stays on the stack
	p.newChains(have, want, early)
	p.barrier()
	var data, verdicts []*setChange
	for _, name := range sortedKeys(changes) {
		c := changes[name]
		if c.spec.isVerdictMap() && !c.replaced {
			verdicts = append(verdicts, c)
		} else {
			data = append(data, c)
		}
	}
	for _, c := range data {
		p.replaceAndAdd(c)
	}
	p.barrier()
	p.rewriteChains(have, want, early)
	for _, c := range verdicts {
		p.replaceAndAdd(c)
	}
	for _, c := range slices.Backward(verdicts) {
		p.remove(c)
	}
	p.barrier()
	for _, c := range data {
		p.remove(c)
	}
	p.barrier()
	p.removeStale(have, want, append(stale, have.extra...))
	return nil
}

// kernelNames notes the kernel's names of sets that have another name
// than their desired one, and the sets read back under two names.
func (p *plan) kernelNames(have *kernelTable) {
	p.names, p.renamed = map[string]string{}, map[string]string{}
	for name, ks := range p.applied.sets {
		if ks.name != name {
			p.names[name] = ks.name
		}
	}
	for _, x := range have.extra {
		if ks := have.sets[logicalName(x)]; ks != nil {
			p.renamed[logicalName(x)] = ks.name
		}
	}
}

// setSteps are the steps that create the new sets and the replacements of
// sets of another spec, or outgrown (sized.go), with the kernel names of
// the sets replaced, which go with the stale ones.
func (p *plan) setSteps(have *kernelTable, want *Table, changes map[string]*setChange, whole bool) (sets []step, stale []string, err error) {
	for _, name := range sortedKeys(want.Sets) {
		s, ks, c := want.Sets[name], have.sets[name], changes[name]
		if ks != nil && sameSpec(ks.spec, s.Spec) {
			if s.Spec.Dynamic || !outgrown(ks.size, p.applied.sets[name].elems.len(), len(c.d.add), s.Len(), whole) {
				continue
			}
		}
		if ks != nil && !whole {
			return nil, nil, errCompareAll
		}
		if err := checkSetName(name); err != nil {
			return nil, nil, err
		}
		kname, size := name, uint32(0)
		if ks != nil {
			var ok bool
			if kname, ok = otherName(name, append([]string{ks.name}, have.extra...)); !ok {
				continue // three names read back: the extras go first
			}
			p.renamed[name] = kname
			stale = append(stale, ks.name)
		}
		if !s.Spec.Dynamic {
			size = sizeFor(s.Len())
			c.d, c.replaced = diffElements(s.elems(), elems{}), true
		}
		if kname != name {
			p.names[name] = kname
		} else {
			delete(p.names, name)
		}
		sets = append(sets, step{op: opAddSet, name: kname, spec: &s.Spec, size: size, messages: 1, weight: 1})
		p.onSuccess(func(k *kernelTable) {
			k.sets[name] = &kernelSet{spec: s.Spec, name: kname, size: size}
		})
	}
	return sets, stale, nil
}

// newChains adds the chains the kernel lacks, empty, and fills those that
// are not base chains at once (early, by name): nothing leads to them until
// the dispatch changes, and a rule bound to a map that already holds its
// elements makes the kernel check every one. A base chain is filled with
// the others: packets reach it as soon as it exists.
func (p *plan) newChains(have *kernelTable, want *Table, early map[string]bool) {
	for name, ch := range want.Chains {
		if have.chains[name] == nil {
			p.add(step{op: opAddChain, chain: ch})
			early[name] = ch.Base == nil
		}
	}
	p.barrier()
	for _, name := range sortedKeys(early) {
		if early[name] {
			p.rewrite(nil, want.Chains[name], false)
		}
	}
}

// rewriteChains rewrites the chains that differ, and then, after every
// other, those reading a set renamed by this plan, forced.
func (p *plan) rewriteChains(have *kernelTable, want *Table, early map[string]bool) {
	var readers []*Chain
	for name, ch := range want.Chains {
		switch {
		case early[name]: // filled already
		case len(p.renamed) > 0 && readsAny(ch, p.renamed):
			readers = append(readers, ch)
		default:
			p.rewrite(have.chains[name], ch, false)
		}
	}
	p.barrier()
	for _, ch := range readers {
		p.rewrite(have.chains[ch.Name], ch, true)
	}
	p.barrier()
}

// setChange is the element changes of one set.
type setChange struct {
	name     string
	spec     SetSpec
	d        elementDiff
	replaced bool // the set is new under another name: every element is added
}

// elementChanges are the element changes of the static sets and maps.
func elementChanges(have *kernelTable, want *Table) map[string]*setChange {
	out := map[string]*setChange{}
	for name, s := range want.Sets {
		if s.Spec.Dynamic {
			continue
		}
		var old elems
		if ks := have.sets[name]; ks != nil && sameSpec(ks.spec, s.Spec) {
			old = ks.elems
		}
		out[name] = &setChange{name: name, spec: s.Spec, d: diffElements(s.elems(), old)}
	}
	return out
}

// rewrite replaces a chain's rules when they differ, or when force says a
// set they read was renamed, flush and refill in one transaction so
// packets see either the old rules or the new.
func (p *plan) rewrite(have *kernelChain, want *Chain, force bool) {
	if !force && have != nil && sameFPs(have.rules, want.Rules) && sameBase(have.base, want.Base) {
		return
	}
	fps := make([]string, len(want.Rules))
	for i, rl := range want.Rules {
		fps[i] = rl.FP
	}
	p.onSuccess(func(k *kernelTable) { k.chains[want.Name] = &kernelChain{base: want.Base, rules: fps} })
	n := len(want.Rules) + 1
	for _, rl := range want.Rules {
		if rl.Anon != nil {
			n += 2
		}
	}
	p.steps = append(p.steps, step{op: opRewrite, chain: want, flush: have != nil, rebase: have != nil && !sameBase(have.base, want.Base),
		messages: int32(n), weight: int32(n)})
}

func sameBase(a, b *Hook) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return *a == *b
}

func sameFPs(fps []string, rules []Rule) bool {
	if len(fps) != len(rules) {
		return false
	}
	for i := range fps {
		if fps[i] != rules[i].FP {
			return false
		}
	}
	return true
}

// elementDiff is the element changes of one set: new keys are added,
// vanished keys deleted, and a key whose value changed (a verdict going
// from reject to drop) is replaced: deleted and re-added in one step, so
// the kernel never sees two values for a key nor a moment without one.
type elementDiff struct {
	add, replaceOld, replaceNew, del []string
}

func diffElements(want, have elems) elementDiff {
	if have.len() == 0 { // a new set: every element is added
		add := make([]string, 0, want.len())
		for id := range want.all() {
			add = append(add, id)
		}
		return elementDiff{add: add}
	}
	gone := map[string]string{} // key → element id, of elements to remove
	for id := range have.all() {
		if _, ok := want.get(id); !ok {
			gone[ElementKey(id)] = id
		}
	}
	var add, replaceOld, replaceNew []string
	for id := range want.all() {
		if _, ok := have.get(id); ok {
			continue
		}
		if len(gone) == 0 {
			add = append(add, id)
			continue
		}
		if old, ok := gone[ElementKey(id)]; ok {
			replaceOld, replaceNew = append(replaceOld, old), append(replaceNew, id)
			delete(gone, ElementKey(id))
			continue
		}
		add = append(add, id)
	}
	del := make([]string, 0, len(gone))
	for _, id := range gone {
		del = append(del, id)
	}
	return elementDiff{add: add, replaceOld: replaceOld, replaceNew: replaceNew, del: del}
}

func (p *plan) replaceAndAdd(c *setChange) {
	replaceOld, replaceNew, add := c.d.replaceOld, c.d.replaceNew, c.d.add
	for i := 0; i < len(replaceNew); i += elementsPerMessage {
		j := min(i+elementsPerMessage, len(replaceNew))
		p.elementStep(c, replaceOld[i:j], true)
		p.elementStep(c, replaceNew[i:j], false)
		// The pair's weight sits on the delete, so no transaction ends between them.
		p.steps[len(p.steps)-2].weight, p.steps[len(p.steps)-1].weight = 2*elementsWeight, 0
	}
	for i := 0; i < len(add); i += elementsPerMessage {
		p.elementStep(c, add[i:min(i+elementsPerMessage, len(add))], false)
	}
}

func (p *plan) remove(c *setChange) {
	del := c.d.del
	for i := 0; i < len(del); i += elementsPerMessage {
		p.elementStep(c, del[i:min(i+elementsPerMessage, len(del))], true)
	}
}

// elementStep adds (or deletes) the elements ids of a set in one message.
// They are encoded when the step is sent, so a plan holds no copy of them.
// The record takes the set's elements once the sync succeeded (adopt).
func (p *plan) elementStep(c *setChange, ids []string, del bool) {
	p.steps = append(p.steps, step{op: opElements, name: p.kernelName(c.name), set: c.name, spec: &c.spec, ids: ids, del: del,
		messages: 1, weight: elementsWeight})
}

// kernelName is the kernel's name of the desired set name.
func (p *plan) kernelName(name string) string {
	if k, ok := p.names[name]; ok {
		return k
	}
	return name
}

// removeStale flushes chains no longer wanted; then, once nothing reads
// them, deletes the sets no longer wanted and those replaced (by their
// kernel names), and last the chains: a verdict map's elements hold its
// chains until the map goes.
func (p *plan) removeStale(have *kernelTable, want *Table, replaced []string) {
	var stale []string
	for _, name := range sortedKeys(have.chains) {
		if want.Chains[name] == nil {
			stale = append(stale, name)
			p.add(step{op: opFlushChain, name: name})
		}
	}
	p.barrier()
	for _, name := range sortedKeys(have.sets) {
		if want.Sets[name] == nil {
			p.add(step{op: opDelSet, name: have.sets[name].name})
			p.onSuccess(func(k *kernelTable) { delete(k.sets, name) })
		}
	}
	for _, kname := range replaced {
		p.add(step{op: opDelSet, name: kname})
	}
	if len(have.extra) > 0 {
		p.onSuccess(func(k *kernelTable) { k.extra = nil })
	}
	for _, name := range stale {
		p.add(step{op: opDelChain, name: name})
		p.onSuccess(func(k *kernelTable) { delete(k.chains, name) })
	}
}

// txWriter is where a plan's transactions go: the kernel's or a fake's.
type txWriter interface {
	// add adds a step to the transaction being built.
	add(p *plan, s *step) error
	// discard drops the steps added since the last queue.
	discard()
	// queue sends the steps added since the last queue as one transaction;
	// it may return the failure of an earlier one.
	queue() error
	// wait waits for the transactions sent and returns the first failure
	// not yet returned.
	wait() error
}

// send sends the steps in transactions of at most maxMessages messages, or
// in one when they all fit: the kernel validates the whole table at every
// commit that adds a rule or a jump (25 ms at 10,000 Services), and one
// transaction is atomic anyway, which makes the barriers moot.
func (p *plan) send(w txWriter) (Stats, error) {
	var st Stats
	total := 0
	for _, s := range p.steps {
		total += int(s.weight)
	}
	split := total > maxMessages && !p.whole
	pending := 0
	// Every return waits for the transaction in flight.
	queue := func() error {
		if pending == 0 {
			return nil
		}
		pending = 0
		st.Transactions++
		return w.queue()
	}
	fail := func(err error) (Stats, error) {
		if werr := w.wait(); werr != nil && werr != err {
			err = errors.Join(err, werr)
		}
		return st, err
	}
	for i := range p.steps {
		s := &p.steps[i]
		if split && pending > 0 && pending+int(s.weight) > maxMessages {
			if err := queue(); err != nil {
				return fail(err)
			}
		}
		if err := w.add(p, s); err != nil {
			// Half a step (a flushed chain without its rules) is not sent.
			w.discard()
			return fail(err)
		}
		pending += int(s.weight)
		st.Messages += int(s.messages)
		if s.barrier && split {
			if err := queue(); err != nil {
				return fail(err)
			}
		}
	}
	if err := queue(); err != nil {
		return fail(err)
	}
	return st, w.wait()
}
