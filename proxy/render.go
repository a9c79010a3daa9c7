package proxy

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// The renderer converges the kernel's netplane table of one family to a
// desired Table, sending only the difference. It remembers what it last
// wrote. Its first sync reads the table back from the kernel, which is how
// it adopts a correct table at start-up without touching it; a full sync
// reads it back again when someone else changed it (sync_watch.go), which
// is how it heals whatever others changed or flushed.

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

// kernelTable is what the renderer knows to be in the kernel.
type kernelTable struct {
	chains map[string]*kernelChain
	sets   map[string]*kernelSet // by the desired set's name
	// extra are sets read back under a second name of one desired set (a
	// replacement cut short): every chain reading the desired set is
	// rewritten to read the one in sets, and the extra deleted. Only a
	// read-back sets it, and the sync that read back compares everything.
	extra []string
}

func newKernelTable() *kernelTable {
	return &kernelTable{chains: map[string]*kernelChain{}, sets: map[string]*kernelSet{}}
}

type kernelChain struct {
	base  *Hook
	rules []string // fingerprints, in order
}

type kernelSet struct {
	spec SetSpec
	// elems are the ids (see Set.Elements) in the kernel, by key only. After
	// a sync it is the desired set's own map, shared read-only (adopt).
	elems map[string]uint32
	name  string // the kernel's name for it: the desired set's, or another (sized.go)
	size  uint32 // the kernel's cap; 0: none
}

// Renderer programs one family.
type Renderer struct {
	dialer  Dialer
	conn    *nftables.Conn // reads; nil until dialled, and after a failure
	writer  *batchWriter   // writes; dialled with conn
	family  nftables.TableFamily
	table   *nftables.Table
	applied *kernelTable // nil: unknown, read it back before the next sync
	// watch reports changes by others, shared with the other family's
	// renderer.
	watch *foreignWatch
}

// NewRenderer programs family in the namespace of d.
func NewRenderer(d Dialer, family nftables.TableFamily) *Renderer {
	return newRenderer(d, family, newForeignWatch(d))
}

// NewRenderers programs every family in the namespace of d. They share one
// watch, so that neither makes the kernel notify it of the other's commits.
func NewRenderers(d Dialer) map[nftables.TableFamily]*Renderer {
	w := newForeignWatch(d)
	out := map[nftables.TableFamily]*Renderer{}
	for _, fam := range Families {
		out[fam] = newRenderer(d, fam, w)
	}
	return out
}

func newRenderer(d Dialer, family nftables.TableFamily, w *foreignWatch) *Renderer {
	return &Renderer{dialer: d, family: family, table: &nftables.Table{Name: TableName, Family: family}, watch: w}
}

// rcvBuf sizes the netlink sockets' buffers: a dump of a big table is read
// in large chunks, and a whole transaction goes out in one sendmsg.
const rcvBuf = 16 << 20

// bigBuffers sizes a netlink socket's buffers for a whole transaction.
func bigBuffers(c *netlink.Conn) error { return forceBuffers(c, rcvBuf, rcvBuf) }

// forceBuffers sets a netlink socket's receive and send buffer sizes (0:
// unchanged). FORCE ignores net.core.rmem_max; it needs CAP_NET_ADMIN,
// which programming nftables needs anyway.
func forceBuffers(c *netlink.Conn, rcv, snd int) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var errs []error
	if err := raw.Control(func(fd uintptr) {
		if rcv > 0 {
			errs = append(errs, unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, rcv))
		}
		if snd > 0 {
			errs = append(errs, unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, snd))
		}
	}); err != nil {
		return err
	}
	return errors.Join(errs...)
}

// Close closes the renderer's connections and its watch.
func (r *Renderer) Close() {
	r.closeConn()
	r.watch.Close()
}

func (r *Renderer) closeConn() {
	if r.conn != nil {
		_ = r.conn.CloseLasting()
		r.conn = nil
	}
	if r.writer != nil {
		r.writer.Close()
		r.writer = nil
	}
}

// dial opens the lasting nftables connection the renderer reads with and
// the writer it sends with.
func (r *Renderer) dial() (*nftables.Conn, *batchWriter, error) {
	opts := []nftables.ConnOption{nftables.AsLasting(), nftables.WithSockOptions(bigBuffers)}
	if r.dialer.NetNS != 0 {
		opts = append(opts, nftables.WithNetNSFd(r.dialer.NetNS))
	}
	c, err := nftables.New(opts...)
	if err != nil {
		return nil, nil, err
	}
	w, err := newBatchWriter(r.dialer)
	if err != nil {
		_ = c.CloseLasting()
		return nil, nil, err
	}
	w.leadWith(r.family, TableName)
	return c, w, nil
}

// Stats counts what one sync sent.
type Stats struct {
	Messages     int
	Transactions int
	ReadBack     bool // the table was read back from the kernel first
}

// Sync makes the kernel table equal to want. After a failure, or with full
// when others changed the table, it first reads the table back so their
// changes are repaired.
func (r *Renderer) Sync(want *Table, full bool) (Stats, error) {
	return r.syncCleanly(want, full, nil)
}

// SyncTouched is a partial sync that compares only the touched parts of
// want with its record, so its cost follows the change, not the table. A
// nil touched, or an unknown record, means a whole-table comparison.
func (r *Renderer) SyncTouched(want *Table, touched *Touched) (Stats, error) {
	return r.syncCleanly(want, false, touched)
}

func (r *Renderer) syncCleanly(want *Table, full bool, touched *Touched) (Stats, error) {
	st, err := r.sync(want, full, touched)
	if err != nil {
		// A failed batch can leave replies queued on the lasting socket:
		// start the next sync on a clean one.
		r.closeConn()
	}
	return st, err
}

func (r *Renderer) sync(want *Table, full bool, touched *Touched) (Stats, error) {
	if r.conn == nil {
		c, w, err := r.dial()
		if err != nil {
			return Stats{}, fmt.Errorf("opening an nftables netlink socket (needs CAP_NET_ADMIN): %w", err)
		}
		r.conn, r.writer, r.applied = c, w, nil
	}
	// Listening before the read-back, so nothing falls in between; draining
	// before it also clears what it makes obsolete.
	r.watch.open()
	foreign := (full || r.applied == nil) && r.watch.changed(r.family)
	fresh, readBack := false, r.applied == nil || (full && foreign)
	if readBack {
		k, err := r.readBack()
		if err != nil {
			r.applied = nil
			return Stats{}, fmt.Errorf("reading table %s %s back: %w", familyName(r.family), TableName, err)
		}
		if k == nil {
			k, fresh = newKernelTable(), true
		}
		r.applied = k
	}
	have, part := r.applied, want
	if touched != nil && !readBack {
		have, part = have.only(touched), want.only(touched)
	}
	p := &plan{r: r}
	if !p.diff(have, part, fresh, part == want) {
		p = &plan{r: r} // a set to replace: compare everything
		p.diff(r.applied, want, fresh, true)
	}
	st, err := r.run(p)
	st.ReadBack = readBack
	if err != nil {
		r.applied = nil // the next sync re-reads the kernel
		return st, err
	}
	for _, c := range p.commit {
		c(r.applied)
	}
	r.adopt(want)
	return st, nil
}

// adopt makes want's element maps the record's after a successful sync,
// instead of a copy: the kernel now holds every element of want (a partial
// sync sent the touched ones, and the model changed no other), and at
// 10,000 Services a copy was a seventh of the live heap. The sets are
// marked programmed, so the model copies a map before changing it.
func (r *Renderer) adopt(want *Table) {
	for name, s := range want.Sets {
		if ks := r.applied.sets[name]; ks != nil && !s.Spec.Dynamic {
			ks.elems, s.programmed = s.Elements, true
		}
	}
}

// run sends the plan with the watch away from the multicast group.
func (r *Renderer) run(p *plan) (Stats, error) {
	if len(p.steps) == 0 {
		return p.run()
	}
	var st Stats
	err := r.watch.away(r.writer, func() (err error) {
		st, err = p.run()
		return err
	})
	return st, err
}

// only is the part of the record that touched names. Its chains and sets
// are the record's own (plan commits go to the whole record by name).
func (k *kernelTable) only(tc *Touched) *kernelTable {
	out := newKernelTable()
	copyNamed(out.chains, k.chains, tc.Chains)
	copyNamed(out.sets, k.sets, tc.Sets)
	for name, ids := range tc.Elems {
		if s := k.sets[name]; s != nil {
			out.sets[name] = &kernelSet{spec: s.spec, elems: pick(s.elems, ids), name: s.name, size: s.size}
		}
	}
	return out
}

// only is the part of the desired table that touched names.
func (t *Table) only(tc *Touched) *Table {
	out := newTable(t.Family)
	copyNamed(out.Chains, t.Chains, tc.Chains)
	copyNamed(out.Sets, t.Sets, tc.Sets)
	for name, ids := range tc.Elems {
		if s := t.Sets[name]; s != nil {
			out.Sets[name] = &Set{Name: s.Name, Spec: s.Spec, Elements: pick(s.Elements, ids)}
		}
	}
	return out
}

func pick(elems map[string]uint32, ids map[string]bool) map[string]uint32 {
	out := make(map[string]uint32, len(ids))
	copyNamed(out, elems, ids)
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

func fingerprint(text string) string {
	sum := sha256.Sum256([]byte(text))
	return "netplane:" + base32.StdEncoding.EncodeToString(sum[:])[:20]
}

// readBack lists the table, its chains with rule fingerprints, its sets
// with their elements. Dynamic sets' elements are the kernel's own.
func (r *Renderer) readBack() (*kernelTable, error) {
	k := newKernelTable()
	tables, err := r.conn.ListTablesOfFamily(r.family)
	if err != nil {
		return nil, err
	}
	found := false
	for _, t := range tables {
		found = found || t.Name == TableName
	}
	if !found {
		return nil, nil // no table: it is created
	}
	chains, err := r.conn.ListChainsOfTableFamily(r.family)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, c := range chains {
		if c.Table.Name == TableName {
			names = append(names, c.Name)
		}
	}
	dump, err := r.dialer.dumper(r.family)
	if err != nil {
		return nil, err
	}
	defer dump.close()
	fps, err := dump.ruleFingerprints(names)
	if err != nil {
		return nil, err
	}
	for _, c := range chains {
		if c.Table.Name != TableName {
			continue
		}
		kc := &kernelChain{rules: fps[c.Name]}
		if c.Hooknum != nil && c.Priority != nil && c.Type != "" {
			kc.base = &Hook{Type: c.Type, Hook: *c.Hooknum, Priority: int32(*c.Priority)}
		}
		k.chains[c.Name] = kc
	}
	sets, err := r.conn.GetSets(r.table)
	if err != nil {
		return nil, err
	}
	var static []string
	for _, s := range sets {
		if s.Anonymous || strings.HasPrefix(s.Name, "__") {
			continue
		}
		ks := &kernelSet{spec: SetSpec{Dynamic: s.Dynamic, Timeout: s.Timeout}, elems: map[string]uint32{}, name: s.Name, size: s.Size}
		if s.IsMap {
			// The library reports a verdict map's data type as its key
			// type and leaves DataType empty; a data map's is decoded.
			ks.spec.Data = s.DataType
			if ks.spec.Data.Name == "" {
				ks.spec.Data = nftables.TypeVerdict
			}
		}
		name := logicalName(s.Name)
		if other := k.sets[name]; other != nil {
			// Both names: the bigger is kept (it can take what either
			// held), every chain reading either is rewritten to read it,
			// and the other goes.
			if capacity(other.size) >= capacity(ks.size) {
				ks, other = other, ks
			}
			k.extra = append(k.extra, other.name)
		}
		k.sets[name] = ks
	}
	for _, ks := range k.sets {
		if !ks.spec.Dynamic {
			static = append(static, ks.name)
		}
	}
	elems, err := dump.setElementIDs(static)
	if err != nil {
		return nil, err
	}
	for kname, ids := range elems {
		k.sets[logicalName(kname)].elems = ids
	}
	return k, nil
}

// anonSetNames names anonymous sets. Left to the kernel ("__set%d"), each
// new name costs a scan of every set in the table with sscanf, which makes
// programming 10,000 Services quadratic (seconds); a name of our own costs
// one strcmp per set. The random part keeps names unique across restarts
// (sets of an earlier process stay in the kernel); IDs start high so they
// never meet the library's own transaction IDs.
var anonSetNames = newAnonNamer()

type anonNamer struct {
	mu    sync.Mutex
	nonce string
	id    uint32
}

func newAnonNamer() *anonNamer {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return &anonNamer{nonce: hex.EncodeToString(b[:]), id: 1 << 30}
}

func (a *anonNamer) next(isMap bool) (uint32, string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.id++
	prefix := "__set"
	if isMap {
		prefix = "__map"
	}
	return a.id, prefix + a.nonce + strconv.FormatUint(uint64(a.id), 36)
}

// plan is the ordered list of changes from what is applied to what is wanted.
type plan struct {
	r *Renderer
	// steps run in order; a step's messages stay in one transaction.
	steps []step
	// commit updates the renderer's record once every step succeeded; it
	// changes only what changed, so a small change costs little.
	commit []func(*kernelTable)
	// names are the kernel's names of the desired sets that have another
	// (sized.go); renamed are the sets replaced by this plan (or read back
	// under two names), whose readers are rewritten.
	names, renamed map[string]string
}

func (p *plan) onSuccess(f func(*kernelTable)) { p.commit = append(p.commit, f) }

type step struct {
	messages int                          // netlink messages sent
	weight   int                          // share of maxMessages
	do       func(c *nftables.Conn) error // adds messages through the library
	own      func(w *batchWriter)         // or encodes its message itself
	barrier  bool                         // start a new transaction after this step
	what     string                       // "add SET", "delete SET" (elements), "delete set SET", "rewrite CHAIN"
}

func (p *plan) add(n int, do func(c *nftables.Conn) error) {
	p.steps = append(p.steps, step{messages: n, weight: n, do: do})
}

func (p *plan) barrier() {
	if n := len(p.steps); n > 0 {
		p.steps[n-1].barrier = true
	}
}

// diff plans, in an order the kernel accepts that makes before it breaks,
// so that however a big sync is split into transactions (at the barriers)
// no dispatch leads to a half-written chain or to endpoints not yet, or no
// longer, there: table, new sets, new (empty) chains; additions and
// replacements in sets and data maps (endpoints, hairpin pairs,
// ClusterIPs); rewritten chains, whose rules may read those new endpoints;
// the verdict maps that dispatch, additions first (firewall-ips, the
// source-range filter, before service-ips) and removals after (service-ips
// before firewall-ips); removals from sets and data maps; then flushed and
// deleted stale chains and sets.
//
// A set replaced by one of another size or spec (sized.go) is created
// with the new sets and filled with the data, verdict maps included; the
// chains reading it are rewritten after all others, and the old set goes
// with the stale ones.
//
// diff reports false, having planned nothing, when a comparison of part of
// the table (whole false) finds a set to replace: that needs every element.
func (p *plan) diff(have *kernelTable, want *Table, fresh, whole bool) bool {
	t := p.r.table
	p.names, p.renamed = map[string]string{}, map[string]string{}
	for name, ks := range p.r.applied.sets {
		if ks.name != name {
			p.names[name] = ks.name
		}
	}
	for _, x := range have.extra {
		if ks := have.sets[logicalName(x)]; ks != nil {
			p.renamed[logicalName(x)] = ks.name
		}
	}
	changes := elementChanges(have, want)
	var stale []string
	var sets []step
	for _, name := range sortedKeys(want.Sets) {
		s, ks, c := want.Sets[name], have.sets[name], changes[name]
		if ks != nil && sameSpec(ks.spec, s.Spec) {
			if s.Spec.Dynamic || !outgrown(ks.size, len(p.r.applied.sets[name].elems), len(c.d.add), len(s.Elements), whole) {
				continue
			}
		}
		if ks != nil && !whole {
			return false
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
			size = sizeFor(len(s.Elements))
			c.d, c.replaced = diffElements(s.Elements, nil), true
		}
		if kname != name {
			p.names[name] = kname
		} else {
			delete(p.names, name)
		}
		sets = append(sets, step{messages: 1, weight: 1, what: "add set " + kname,
			do: func(c *nftables.Conn) error { return c.AddSet(p.namedSet(s, kname, size), nil) }})
		p.onSuccess(func(k *kernelTable) {
			k.sets[name] = &kernelSet{spec: s.Spec, elems: map[string]uint32{}, name: kname, size: size}
		})
	}
	if fresh {
		p.add(1, func(c *nftables.Conn) error { c.AddTable(t); return nil })
	}
	p.steps = append(p.steps, sets...)
	early := map[string]bool{}
	for name, ch := range want.Chains {
		if have.chains[name] == nil {
			p.add(1, func(c *nftables.Conn) error { c.AddChain(p.chain(ch)); return nil })
			// A new chain gets its rules before the elements: nothing
			// leads to it until the dispatch changes below, and a rule
			// bound to a map that already holds its elements makes the
			// kernel check every one. Not a base chain: packets reach it.
			early[name] = ch.Base == nil
		}
	}
	p.barrier()
	for _, name := range sortedKeys(early) {
		if early[name] {
			p.rewrite(nil, want.Chains[name], false)
		}
	}
	p.barrier()
	var data, verdicts []*setChange
	for _, name := range sortedKeys(changes) {
		c := changes[name]
		if c.spec.Data.Name == nftables.TypeVerdict.Name && !c.replaced {
			verdicts = append(verdicts, c)
		} else {
			data = append(data, c)
		}
	}
	for _, c := range data {
		p.replaceAndAdd(c.name, c.spec, c.d)
	}
	p.barrier()
	var readers []*Chain
	for name, ch := range want.Chains {
		switch {
		case early[name]: // filled above
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
	for _, c := range verdicts {
		p.replaceAndAdd(c.name, c.spec, c.d)
	}
	for _, c := range slices.Backward(verdicts) {
		p.remove(c.name, c.spec, c.d.del)
	}
	p.barrier()
	for _, c := range data {
		p.remove(c.name, c.spec, c.d.del)
	}
	p.barrier()
	p.removeStale(have, want, append(stale, have.extra...))
	return true
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
		var old map[string]uint32
		if ks := have.sets[name]; ks != nil && sameSpec(ks.spec, s.Spec) {
			old = ks.elems
		}
		out[name] = &setChange{name: name, spec: s.Spec, d: diffElements(s.Elements, old)}
	}
	return out
}

func sameSpec(a, b SetSpec) bool {
	return a.Data.Name == b.Data.Name && a.Dynamic == b.Dynamic && a.Timeout == b.Timeout
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
	p.add(n, func(c *nftables.Conn) error {
		ch := p.chain(want)
		if have != nil && !sameBase(have.base, want.Base) {
			c.DelChain(ch) // a hook or priority someone changed
			c.AddChain(ch)
		} else if have != nil {
			c.FlushChain(ch)
		}
		for i, rl := range want.Rules {
			if err := p.addRule(c, ch, rl, fps[i]); err != nil {
				return fmt.Errorf("chain %s: %w", want.Name, err)
			}
		}
		return nil
	})
	p.steps[len(p.steps)-1].what = "rewrite " + want.Name
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
// vanished keys deleted, and a key whose value changed (a Service going
// from reject to drop) is replaced: deleted and re-added in one step, so
// the kernel never sees two values for a key nor a moment without one.
type elementDiff struct {
	add, replaceOld, replaceNew, del []string
}

func diffElements(want, have map[string]uint32) elementDiff {
	if len(have) == 0 { // a new set: every element is added
		add := make([]string, 0, len(want))
		for id := range want {
			add = append(add, id)
		}
		return elementDiff{add: add}
	}
	gone := map[string]string{} // key → element id, of elements to remove
	for id := range have {
		if _, ok := want[id]; !ok {
			gone[elementKey(id)] = id
		}
	}
	var add, replaceOld, replaceNew []string
	for id := range want {
		if _, ok := have[id]; ok {
			continue
		}
		if len(gone) == 0 {
			add = append(add, id)
			continue
		}
		if old, ok := gone[elementKey(id)]; ok {
			replaceOld, replaceNew = append(replaceOld, old), append(replaceNew, id)
			delete(gone, elementKey(id))
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

func (p *plan) replaceAndAdd(set string, spec SetSpec, d elementDiff) {
	replaceOld, replaceNew, add := d.replaceOld, d.replaceNew, d.add
	for i := 0; i < len(replaceNew); i += elementsPerMessage {
		j := min(i+elementsPerMessage, len(replaceNew))
		p.elementStep(set, spec, replaceOld[i:j], true)
		p.elementStep(set, spec, replaceNew[i:j], false)
		// The pair's weight sits on the delete, so no transaction ends between them.
		p.steps[len(p.steps)-2].weight, p.steps[len(p.steps)-1].weight = 2*elementsWeight, 0
	}
	for i := 0; i < len(add); i += elementsPerMessage {
		p.elementStep(set, spec, add[i:min(i+elementsPerMessage, len(add))], false)
	}
}

func (p *plan) remove(set string, spec SetSpec, del []string) {
	for i := 0; i < len(del); i += elementsPerMessage {
		p.elementStep(set, spec, del[i:min(i+elementsPerMessage, len(del))], true)
	}
}

// elementStep adds (or deletes) the elements ids in one message. They are
// decoded when the step runs, so a plan holds no copy of them. The record
// takes the set's elements once the sync succeeded (Renderer.adopt).
func (p *plan) elementStep(set string, spec SetSpec, ids []string, del bool) {
	typ, what := uint16(unix.NFT_MSG_NEWSETELEM), "add "+set
	if del {
		typ, what = unix.NFT_MSG_DELSETELEM, "delete "+set
	}
	t, kname := p.r.table, p.kernelName(set)
	p.steps = append(p.steps, step{messages: 1, weight: elementsWeight, what: what, own: func(w *batchWriter) {
		w.beginOwn(typ, t.Family)
		w.ownB = appendElements(w.ownB, t.Name, kname, spec, ids)
		w.endOwn()
	}})
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
	t := p.r.table
	var stale []string
	for _, name := range sortedKeys(have.chains) {
		if want.Chains[name] == nil {
			stale = append(stale, name)
			p.add(1, func(c *nftables.Conn) error { c.FlushChain(&nftables.Chain{Table: t, Name: name}); return nil })
		}
	}
	p.barrier()
	for _, name := range sortedKeys(have.sets) {
		if want.Sets[name] == nil {
			kname := have.sets[name].name
			p.add(1, func(c *nftables.Conn) error { c.DelSet(&nftables.Set{Table: t, Name: kname}); return nil })
			p.steps[len(p.steps)-1].what = "delete set " + name
			p.onSuccess(func(k *kernelTable) { delete(k.sets, name) })
		}
	}
	for _, kname := range replaced {
		p.add(1, func(c *nftables.Conn) error { c.DelSet(&nftables.Set{Table: t, Name: kname}); return nil })
		p.steps[len(p.steps)-1].what = "delete set " + kname
	}
	if len(have.extra) > 0 {
		p.onSuccess(func(k *kernelTable) { k.extra = nil })
	}
	for _, name := range stale {
		p.add(1, func(c *nftables.Conn) error { c.DelChain(&nftables.Chain{Table: t, Name: name}); return nil })
		p.steps[len(p.steps)-1].what = "delete chain " + name
		p.onSuccess(func(k *kernelTable) { delete(k.chains, name) })
	}
}

func (p *plan) chain(ch *Chain) *nftables.Chain {
	c := &nftables.Chain{Name: ch.Name, Table: p.r.table}
	if ch.Base != nil {
		c.Type = ch.Base.Type
		c.Hooknum = &ch.Base.Hook
		prio := nftables.ChainPriority(ch.Base.Priority)
		c.Priority = &prio
	}
	return c
}

// namedSet is s as the kernel's set kname of size (0: resizable).
func (p *plan) namedSet(s *Set, kname string, size uint32) *nftables.Set {
	ns := &nftables.Set{
		Table:         p.r.table,
		Name:          kname,
		Size:          size,
		KeyType:       s.Spec.Key,
		DataType:      s.Spec.Data,
		IsMap:         s.Spec.isMap(),
		Concatenation: strings.Contains(s.Spec.Key.Name, " . "),
	}
	if s.Spec.Dynamic {
		ns.Dynamic, ns.HasTimeout, ns.Timeout = true, true, s.Spec.Timeout
	}
	return ns
}

// addRule adds one rule, first creating its anonymous set if it has one.
func (p *plan) addRule(c *nftables.Conn, ch *nftables.Chain, rl Rule, fp string) error {
	exprs := renamed(rl.Exprs, p.names)
	if rl.Anon != nil {
		set := &nftables.Set{
			Table: p.r.table, Anonymous: true, Constant: true,
			KeyType: rl.Anon.Key, DataType: rl.Anon.Data, IsMap: rl.Anon.Data.Name != "",
			Interval: rl.Anon.Interval,
		}
		set.ID, set.Name = anonSetNames.next(set.IsMap)
		if err := c.AddSet(set, rl.Anon.Elements); err != nil {
			return err
		}
		named := exprs
		exprs = make([]expr.Any, len(named))
		for i, e := range named {
			if l, ok := e.(*expr.Lookup); ok && l.SetName == anonSetName {
				l2 := *l
				l2.SetName, l2.SetID = set.Name, set.ID
				e = &l2
			}
			exprs[i] = e
		}
	}
	c.AddRule(&nftables.Rule{Table: p.r.table, Chain: ch, Exprs: exprs,
		UserData: userdata.AppendString(nil, userdata.TypeComment, fp)})
	return nil
}

// run sends the steps in transactions of at most maxMessages messages, or
// in one when they all fit: the kernel validates the whole table at every
// commit that adds a rule or a jump (25 ms at 10,000 Services), and one
// transaction is atomic anyway, which makes the barriers moot.
func (p *plan) run() (Stats, error) {
	var st Stats
	total := 0
	for _, s := range p.steps {
		total += s.weight
	}
	split := total > maxMessages
	pending := 0
	w := p.r.writer
	// Transactions are queued: the next is encoded while the kernel applies
	// the last. Every return waits for the one in flight.
	send := func() error {
		if pending == 0 {
			return nil
		}
		pending = 0
		st.Transactions++
		return w.Queue()
	}
	fail := func(err error) (Stats, error) {
		if werr := w.Wait(); werr != nil && werr != err {
			err = errors.Join(err, werr)
		}
		return st, err
	}
	for _, s := range p.steps {
		if pending > 0 && pending+s.weight > maxMessages {
			if err := send(); err != nil {
				return fail(err)
			}
		}
		if s.own != nil {
			s.own(w)
		} else if err := s.do(w.library()); err != nil {
			// Half a step (a flushed chain without its rules) is not sent.
			w.Discard()
			return fail(err)
		}
		pending += s.weight
		st.Messages += s.messages
		if s.barrier && split {
			if err := send(); err != nil {
				return fail(err)
			}
		}
	}
	if err := send(); err != nil {
		return fail(err)
	}
	return st, w.Wait()
}
