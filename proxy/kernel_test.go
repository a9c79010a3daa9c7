package proxy

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
	"github.com/netplane/netplane/nft"
	"github.com/netplane/netplane/nodeview"
)

// kernelNS is a throwaway namespace and a way to connect to its nftables.
func kernelNS(t *testing.T) (*netns.NS, nft.Dialer) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs the kernel")
	}
	framework.RequireRoot(t)
	ns := netns.New(t, "kernel")
	d, closeNS, err := nft.NamespaceDialer(ns.Path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = closeNS() })
	return ns, d
}

func syncAll(t *testing.T, rs map[nodeview.Family]nft.Syncer, d *Desired, full bool) int {
	t.Helper()
	n := 0
	for fam, r := range rs {
		st, err := r.Sync(d.Tables[fam], full)
		if err != nil {
			t.Fatalf("sync %v: %v", fam, err)
		}
		n += st.Messages
	}
	return n
}

// kernelSyncers are the programmers of the proxy's tables in the namespace of
// dial, closed when the test ends.
func kernelSyncers(t *testing.T, dial nft.Dialer) map[nodeview.Family]nft.Syncer {
	rs := programmers(dial)
	t.Cleanup(func() {
		for _, r := range rs {
			r.Close()
		}
	})
	return rs
}

func TestProxyTablesAreProgrammedAdoptedPatchedAndHealed(t *testing.T) {
	ns, conn := kernelNS(t)
	in := overall()
	d := Build(in)

	rs := kernelSyncers(t, conn)
	if n := syncAll(t, rs, d, true); n == 0 {
		t.Fatal("first sync sent nothing")
	}
	out := ns.MustExec(t, "nft", "list", "table", "ip", TableName)
	for _, want := range []string{"service-ips", "172.30.0.41 . tcp . 80 : goto pick-tcp-2-pool-20", "dnat ip to ip daddr . meta l4proto . tcp dport . numgen random mod 2 map @pool-20", "numgen random mod 2 map @endpoints-", "172.30.0.41 . tcp . 80 . 0x00000001 : 10.180.1.1 . 8080", "203.0.113.0/25"} {
		if !strings.Contains(out, want) {
			t.Errorf("nft list table ip netplane lacks %q:\n%s", want, out)
		}
	}
	if n := syncAll(t, rs, d, false); n != 0 {
		t.Errorf("a sync without changes sent %d messages, want 0", n)
	}
	// A restarted proxier reads the table back and finds nothing to change.
	if n := syncAll(t, kernelSyncers(t, conn), d, true); n != 0 {
		t.Errorf("adopting a correct table sent %d messages, want 0", n)
	}

	// One endpoint more: svc1 is the only Service with 2 endpoints and
	// becomes the only one with 3, so a shared chain comes and one goes,
	// besides the elements.
	in.Slices[nsName("ns1", "svc1")] = []*sliceRecord{withEndpoint(in.Slices[nsName("ns1", "svc1")][0], "10.180.2.1")}
	d2 := Build(in)
	if n := syncAll(t, rs, d2, false); n == 0 || n > 12 {
		t.Errorf("one endpoint more sent %d messages, want 1 to 12 (two chains and elements)", n)
	}
	if out := ns.MustExec(t, "nft", "list", "table", "ip", TableName); !strings.Contains(out, "10.180.2.1") {
		t.Errorf("new endpoint missing:\n%s", out)
	}

	// A key whose verdict changes (reject → drop: internalTrafficPolicy
	// Local and only a remote endpoint) is replaced in place.
	localPolicyWithOnlyARemoteEndpoint(in, "svc6")
	syncAll(t, rs, Build(in), false)
	if out := ns.MustExec(t, "nft", "list", "map", "ip", TableName, "no-endpoint-services"); !strings.Contains(out, "172.30.0.46 . tcp . 80 : drop") {
		t.Errorf("reject did not become drop:\n%s", out)
	}

	// Deleting a Service removes its chains.
	in.Services = in.Services[1:]
	d3 := Build(in)
	syncAll(t, rs, d3, false)
	if out := ns.MustExec(t, "nft", "list", "table", "ip", TableName); strings.Contains(out, "ns1/svc1") {
		t.Errorf("deleted Service still has rules:\n%s", out)
	}
	if n := syncAll(t, kernelSyncers(t, conn), d3, true); n != 0 {
		t.Errorf("after deletion the kernel differs from the model by %d messages", n)
	}

	for _, vandal := range [][]string{{"flush", "table", "ip", TableName}, {"flush", "ruleset"}, {"delete", "chain", "ip", TableName, "reject-chain"}} {
		if vandal[0] == "delete" {
			ns.MustExec(t, "nft", "flush", "chain", "ip", TableName, "cluster-ips-check")
			ns.MustExec(t, "nft", "delete", "element", "ip", TableName, "no-endpoint-services", "{ 172.30.0.46 . tcp . 80 }")
		}
		ns.MustExec(t, "nft", vandal...)
		if n := syncAll(t, rs, d3, false); n != 0 {
			t.Errorf("a partial sync after nft %v sent %d messages: it must trust its memory", vandal, n)
		}
		if n := syncAll(t, rs, d3, true); n == 0 {
			t.Errorf("a full sync after nft %v repaired nothing", vandal)
		}
		if n := syncAll(t, kernelSyncers(t, conn), d3, true); n != 0 {
			t.Errorf("after healing nft %v the kernel still differs by %d messages", vandal, n)
		}
	}
}

// localPolicyWithOnlyARemoteEndpoint gives the Service of that name in ns6
// internalTrafficPolicy Local and one endpoint on another node, so its
// verdict turns from reject (no endpoints) to drop (no local endpoint).
func localPolicyWithOnlyARemoteEndpoint(in Input, name string) {
	for i, s := range in.Services {
		if s.name == name {
			c := *s
			c.ports = slices.Clone(s.ports)
			for j := range c.ports {
				c.ports[j].InternalLocal = true
			}
			in.Services[i] = &c
		}
	}
	in.Slices[nsName("ns6", name)] = []*sliceRecord{sliceRecordOf(slice("ns6/"+name, name+"-a", map[string]int32{"": 80}, v1.ProtocolTCP, ep{ip: "10.180.1.6", node: "node-b"}))}
}

func nsName(ns, name string) (k struct{ Namespace, Name string }) {
	k.Namespace, k.Name = ns, name
	return k
}

// TestABigSyncIsSplitIntoTransactions programs 1,000 Services with
// 10 endpoints: many transactions, none so big that the kernel's echo of
// its rules overflows the socket, and a restart adopts the result as is.
func TestABigSyncIsSplitIntoTransactions(t *testing.T) {
	_, conn := kernelNS(t)
	d := Build(scaleInput(1000))
	r := kernelSyncers(t, conn)[nodeview.IPv4]
	start := time.Now()
	st, err := r.Sync(d.Tables[nodeview.IPv4], true)
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if st.Transactions < 2 {
		t.Errorf("%d messages went in %d transaction(s); want them split", st.Messages, st.Transactions)
	}
	start = time.Now()
	st, err = kernelSyncers(t, conn)[nodeview.IPv4].Sync(d.Tables[nodeview.IPv4], true)
	if err != nil || st.Messages != 0 {
		t.Errorf("adopting: %d messages, %v; want 0 and no error", st.Messages, err)
	}
	t.Logf("1000 Services x 10 endpoints: first sync %v, full sync over a correct table %v", took, time.Since(start))
}

// TestFullSyncReadsBackOnlyWhenOthersChangedTheTable: the periodic full
// sync trusts its record while the kernel's notifications show no change
// to the table by anyone else, including the programmer of the other family
// and other tables' owners; an outside change to it brings the read-back
// of what it touched, or of the whole table.
func TestFullSyncReadsBackOnlyWhenOthersChangedTheTable(t *testing.T) {
	ns, conn := kernelNS(t)
	d := Build(overall())
	rs := kernelSyncers(t, conn)
	ip4 := rs[nodeview.IPv4]
	syncAll(t, rs, d, true)
	steps := []struct {
		name     string
		cmd      []string // run before the full sync; none: the other family's programmer re-syncs
		readBack bool
		reread   int // sets and chains read back alone
	}{
		{"untouched", nil, false, 0},
		{"another table changed", []string{"add", "table", "ip", "someone-else"}, false, 0},
		{"our table of the other family changed", []string{"add", "chain", "ip6", TableName, "stray"}, false, 0},
		{"an element added to our map", []string{"add", "element", "ip", TableName, "cluster-ips", "{ 10.9.9.9 }"}, false, 1},
		{"healed: untouched again", nil, false, 0},
		{"a chain made in our table", []string{"add", "chain", "ip", TableName, "stray"}, true, 0},
		{"ruleset flushed", []string{"flush", "ruleset"}, true, 0},
	}
	for _, s := range steps {
		if s.cmd != nil {
			ns.MustExec(t, "nft", s.cmd...)
		}
		if _, err := rs[nodeview.IPv6].Sync(d.Tables[nodeview.IPv6], true); err != nil {
			t.Fatal(err)
		}
		st, err := ip4.Sync(d.Tables[nodeview.IPv4], true)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if st.ReadBack != s.readBack || st.Reread != s.reread {
			t.Errorf("%s: full sync read the table back %v, %d of its parts; want %v, %d", s.name, st.ReadBack, st.Reread, s.readBack, s.reread)
		}
	}
	if out := ns.MustExec(t, "nft", "list", "table", "ip", TableName); !strings.Contains(out, "service-ips") {
		t.Errorf("the flushed table was not rebuilt:\n%s", out)
	}
}

// TestPartialSyncOfTouchedPartsLeavesTheKernelAsAWholeDiffWould: the
// steady-state path diffs only what the model says changed; after each
// kind of change, a restarted programmer (which compares everything) finds
// nothing left to do.
func TestPartialSyncOfTouchedPartsLeavesTheKernelAsAWholeDiffWould(t *testing.T) {
	_, conn := kernelNS(t)
	in := overall()
	m := NewModel()
	rs := kernelSyncers(t, conn)
	sync := func(name string) int {
		d := m.Build(in)
		touched := m.TakeTouched()
		n := 0
		for fam, r := range rs {
			var st nft.Stats
			var err error
			if touched == nil {
				st, err = r.Sync(d.Tables[fam], false)
			} else {
				st, err = r.SyncTouched(d.Tables[fam], touched[fam])
			}
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			n += st.Messages
		}
		if left := syncAll(t, kernelSyncers(t, conn), d, true); left != 0 {
			t.Errorf("%s: a whole-table diff after the partial sync still sends %d messages", name, left)
		}
		return n
	}
	sync("first sync")
	if n := sync("nothing changed"); n != 0 {
		t.Errorf("a sync without changes sent %d messages", n)
	}

	in.Slices[nsName("ns1", "svc1")] = []*sliceRecord{withEndpoint(in.Slices[nsName("ns1", "svc1")][0], "10.180.2.1")}
	if n := sync("one endpoint more"); n == 0 || n > 12 {
		t.Errorf("one endpoint more sent %d messages, want 1 to 12 (two shared chains and elements)", n)
	}
	localPolicyWithOnlyARemoteEndpoint(in, "svc6")
	sync("reject becomes drop")
	removed := in.Services[0]
	in.Services = in.Services[1:]
	sync("a Service deleted")
	in.Services = append(in.Services, removed)
	sync("the Service back")
}

// TestChangesMakeBeforeBreak: however a big sync is split into
// transactions, nothing dispatches to endpoints not yet, or no longer,
// there, and a source-range filter outlives its Service's dispatch.
func TestChangesMakeBeforeBreak(t *testing.T) {
	svc1, svc2 := nsName("ns1", "svc1"), nsName("ns2", "svc2")
	for _, c := range []struct {
		name   string
		change func(in *Input)
		want   func(in Input) []string
	}{{
		// A pooled Service with one endpoint more moves to another pool
		// map and another shared chain; its old map held only it. The new
		// chain is filled first (nothing leads to it yet), the dispatch
		// moves only once the endpoints are there.
		"pooled endpoint count changes", func(in *Input) {
			in.Slices[svc1] = []*sliceRecord{withEndpoint(in.Slices[svc1][0], "10.180.2.1")}
		}, func(in Input) []string {
			sp := &in.Services[0].ports[0]
			return []string{"add set " + poolShard(sp, 3), "rewrite pick-tcp-3-" + poolShard(sp, 3), "add hairpin", "add " + poolShard(sp, 3),
				"delete service-ips", "add service-ips", "delete set " + poolShard(sp, 2)}
		},
	}, {
		// A NodePort Service's own chain reads its new slot only once the
		// slot is there.
		"a Service's own chain reads a new endpoint", func(in *Input) {
			in.Slices[svc2] = []*sliceRecord{withEndpoint(in.Slices[svc2][0], "10.180.2.2")}
		}, func(in Input) []string {
			return []string{"add endpoints-206", "add hairpin", "rewrite service-42NFTM6N-ns2/svc2/tcp/p80"}
		},
	}, {
		// A deleted load balancer Service stops being dispatched before its
		// source-range filter goes.
		"a Service with source ranges deleted", func(in *Input) {
			in.Services = slices.DeleteFunc(in.Services, func(s *serviceRecord) bool { return s.name == "svc5" })
		}, func(Input) []string {
			return []string{"delete service-nodeports", "delete service-ips", "delete firewall-ips", "delete cluster-ips", "delete hairpin"}
		},
	}} {
		t.Run(c.name, func(t *testing.T) {
			in := overall()
			before := Build(in).Tables[nodeview.IPv4]
			c.change(&in)
			after := Build(in).Tables[nodeview.IPv4]
			if got, want := planSteps(t, before, after, nil), c.want(in); !slices.Equal(got, want) {
				t.Errorf("steps %q, want %q", got, want)
			}
		})
	}
}

// planSteps are the labelled steps of a whole sync, on the fake kernel,
// from before (its sets sized for their elements unless sizes says
// otherwise) to after, but the table's and chains' additions, flushes and
// deletions (the deletions are the last steps;
// TestSetsAreSizedAndReplacedWhenOutgrown checks they come after the sets
// that lead to them). The fake refuses steps in an order the kernel
// would refuse.
func planSteps(t *testing.T, before, after *nft.Table, sizes map[string]uint32) []string {
	t.Helper()
	f := nft.NewFake(before.ID())
	if _, err := f.Sync(before, true); err != nil {
		t.Fatal(err)
	}
	for name, size := range sizes {
		f.Resize(name, size)
	}
	if _, err := f.Sync(after, true); err != nil {
		t.Fatalf("%v\n%s", err, f.Dump())
	}
	var got []string
	for _, s := range f.Steps() {
		if !strings.HasPrefix(s, "delete set affinity-") && !strings.HasPrefix(s, "delete chain ") &&
			!strings.HasPrefix(s, "add chain ") && !strings.HasPrefix(s, "flush chain ") && s != "add table" {
			got = append(got, s)
		}
	}
	return got
}

// TestSetsAreSizedAndReplacedWhenOutgrown: static sets are fixed-size
// tables in the kernel; a partial sync that would outgrow one replaces it
// under another name (every reader switched, the old one gone), a full
// sync shrinks one left far too big, a restart adopts either name, and a
// set found under both names (a replacement cut short) is made one. It is
// long because each step starts from the kernel state the one before left.
func TestSetsAreSizedAndReplacedWhenOutgrown(t *testing.T) {
	ns, conn := kernelNS(t)
	m := NewModel()
	rs := kernelSyncers(t, conn)
	r := rs[nodeview.IPv4]
	list := func() string { return ns.MustExec(t, "nft", "list", "table", "ip", TableName) }
	// input is n pooled Services and NodePort Services np<i> for nodePorts
	// (each with a chain of its own).
	input := func(n int, nodePorts ...int) Input {
		in := scaleInput(n)
		for _, i := range nodePorts {
			name := fmt.Sprintf("np%d", i)
			in.Services = append(in.Services, serviceRecordOf(svc("bench", name, func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeNodePort
				s.Spec.ClusterIP = fmt.Sprintf("172.31.0.%d", i+1)
				s.Spec.Ports = []v1.ServicePort{{Name: "p80", Protocol: v1.ProtocolTCP, Port: 80, NodePort: int32(30000 + i)}}
			})))
			in.Slices[nsName("bench", name)] = []*sliceRecord{sliceRecordOf(slice("bench/"+name, name+"-a", map[string]int32{"p80": 8080}, v1.ProtocolTCP,
				ep{ip: fmt.Sprintf("10.9.%d.1", i), node: "node-b"}, ep{ip: fmt.Sprintf("10.9.%d.2", i), node: "node-b"}))}
		}
		return in
	}
	sync := func(in Input, full bool) {
		t.Helper()
		d := m.Build(in)
		touched := m.TakeTouched()
		var err error
		if full || touched == nil {
			_, err = r.Sync(d.Tables[nodeview.IPv4], full)
		} else {
			_, err = r.SyncTouched(d.Tables[nodeview.IPv4], touched[nodeview.IPv4])
		}
		if err != nil {
			t.Fatalf("%d Services: %v", len(in.Services), err)
		}
		st, err := kernelSyncers(t, conn)[nodeview.IPv4].Sync(d.Tables[nodeview.IPv4], true)
		if err != nil || st.Messages != 0 {
			t.Fatalf("%d Services: a restart sent %d messages (%v); want 0", len(in.Services), st.Messages, err)
		}
	}
	// has checks that the service-ips map is named name, of size, read by
	// a rule, and the only one.
	has := func(name string, size int) {
		t.Helper()
		out := list()
		for _, want := range []string{"map " + name + " {", fmt.Sprintf("size %d", size), "vmap @" + name + " comment"} {
			if !strings.Contains(out, want) {
				t.Fatalf("no %q in the table:\n%s", want, out)
			}
		}
		for _, other := range []string{"service-ips", "service-ips-b", "service-ips-c"} {
			if other != name && strings.Contains(out, "map "+other+" {") {
				t.Fatalf("%s is still there:\n%s", other, out)
			}
		}
	}
	// byHand makes the map under name, empty: a replacement cut short.
	byHand := func(name, size string) {
		ns.MustExec(t, "nft", "add", "map", "ip", TableName, name, "{ type ipv4_addr . inet_proto . inet_service : verdict ;"+size+" }")
		r = kernelSyncers(t, conn)[nodeview.IPv4]
	}
	sync(input(100, 0, 1, 2), false)
	has("service-ips", 192)
	// 300 ClusterIPs more, past 192, and a NodePort Service gone: the
	// old map still leads to its chain until the map is deleted.
	sync(input(400, 0, 1), false)
	has("service-ips-b", 768)
	sync(input(300, 0, 1), false) // no shrinking in a partial sync
	has("service-ips-b", 768)
	sync(input(50, 0, 1), true) // 52*8 < 768
	has("service-ips", 192)

	// Both names read back: the bigger is kept, the other goes.
	byHand("service-ips-b", " size 64 ;")
	sync(input(50, 0, 1), true)
	has("service-ips", 192)
	// Both names, and the kept one outgrown: the third name.
	byHand("service-ips-b", " size 64 ;")
	sync(input(400, 0), true)
	has("service-ips-c", 768)
	// The bigger is one without a size: kept, and sized by the next full
	// sync, under a name neither had.
	byHand("service-ips-b", "")
	want := m.Build(input(400, 0)).Tables[nodeview.IPv4]
	if _, err := r.Sync(want, true); err != nil {
		t.Fatal(err)
	}
	if out := list(); strings.Count(out, "map service-ips") != 1 {
		t.Fatalf("a set under both names was not made one:\n%s", out)
	}
	sync(input(400, 0), true)
	has("service-ips", 768)
}

// A set about to outgrow its size is replaced in the make-before-break
// order: created under its other name and filled, its readers rewritten
// after every other chain, then the old set deleted.
func TestOutgrownSetIsFilledBeforeItsReadersSwitch(t *testing.T) {
	in := overall()
	before := Build(in).Tables[nodeview.IPv4]
	in.Services = append(in.Services, serviceRecordOf(svc("ns9", "new", func(s *v1.Service) {
		s.Spec.ClusterIP = "172.30.9.9"
		s.Spec.Ports = []v1.ServicePort{tcp("p", 80)}
	})))
	after := Build(in).Tables[nodeview.IPv4]
	full := uint32(before.Sets[setClusterIPs].Len())
	steps := planSteps(t, before, after, map[string]uint32{setClusterIPs: full})
	at := func(what string) int {
		i := slices.Index(steps, what)
		if i < 0 {
			t.Fatalf("no step %q in %q", what, steps)
		}
		return i
	}
	order := []int{at("add set cluster-ips-b"), at("add cluster-ips"), at("rewrite " + chClusterIPsCheck), at("delete set cluster-ips")}
	if !slices.IsSorted(order) {
		t.Errorf("steps %q: want the new set, its elements, its reader, the old set's deletion in that order", steps)
	}
	for _, s := range steps[order[2]+1:] {
		if strings.HasPrefix(s, "rewrite ") {
			t.Errorf("%s comes after the switch; want every other rewrite before it", s)
		}
	}
}

// A changed affinity timeout is a new set spec: the set is replaced under
// another name while its endpoint chains are rewritten to it (deleting it
// first failed: its chains still read it).
func TestAffinityTimeoutChangeReplacesItsSets(t *testing.T) {
	ns, conn := kernelNS(t)
	in := overall()
	syncAll(t, kernelSyncers(t, conn), Build(in), true)
	for i, s := range in.Services {
		if s.name == "svc5" {
			c := *s
			c.ports = slices.Clone(s.ports)
			c.ports[0].Affinity = 20 * time.Second
			in.Services[i] = &c
		}
	}
	d := Build(in)
	syncAll(t, kernelSyncers(t, conn), d, true)
	if n := syncAll(t, kernelSyncers(t, conn), d, true); n != 0 {
		t.Errorf("a restart after the change sent %d messages, want 0", n)
	}
	if out := ns.MustExec(t, "nft", "list", "table", "ip", TableName); !strings.Contains(out, "timeout 20s") || strings.Contains(out, "timeout 10s") {
		t.Errorf("the affinity sets do not all have the new timeout:\n%s", out)
	}
}
