package proxy

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/internal/role"
	"github.com/netplane/netplane/nft"
	"github.com/netplane/netplane/nodeview"
)

// fakeNode is a proxier whose tables are nft fakes and whose informer
// caches are stores the test fills, as the informers would, handlers
// included. Nothing touches the kernel.
type fakeNode struct {
	t     *testing.T
	p     *proxier
	fakes map[nodeview.Family]*nft.Fake
	calls *syncCalls
	nodes cache.Indexer // the Node lister's
	reg   *prometheus.Registry
}

// syncCalls records how the proxier synced its tables.
type syncCalls struct {
	mu    sync.Mutex
	calls []string // "full", "whole" (Sync, not full), "touched"
	// touched are the chains and sets each partial sync named.
	touched []*nft.Touched
}

func (c *syncCalls) list() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.calls)
}

// recorder is a Syncer that notes each call in calls.
type recorder struct {
	nft.Syncer
	fam   nodeview.Family
	calls *syncCalls
}

// Calls are noted once done, so a test that saw one may use the fake.
func (r recorder) Sync(want *nft.Table, full bool) (nft.Stats, error) {
	defer r.note(map[bool]string{true: "full", false: "whole"}[full], nil)
	return r.Syncer.Sync(want, full)
}

func (r recorder) SyncTouched(want *nft.Table, touched *nft.Touched) (nft.Stats, error) {
	defer r.note("touched", touched)
	return r.Syncer.SyncTouched(want, touched)
}

func (r recorder) note(call string, touched *nft.Touched) {
	if r.fam != nodeview.IPv4 {
		return // both families are synced alike: the IPv4 table's calls say it
	}
	r.calls.mu.Lock()
	defer r.calls.mu.Unlock()
	r.calls.calls = append(r.calls.calls, call)
	r.calls.touched = append(r.calls.touched, touched)
}

func newFakeNode(t *testing.T) *fakeNode {
	n := &fakeNode{t: t, fakes: map[nodeview.Family]*nft.Fake{}, calls: &syncCalls{},
		nodes: cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})}
	syncers := map[nodeview.Family]nft.Syncer{}
	for i, id := range tableIDs() {
		f, fam := nft.NewFake(id), nodeview.Families[i]
		n.fakes[fam], syncers[fam] = f, recorder{Syncer: f, fam: fam, calls: n.calls}
	}
	metrics := newMetrics()
	cfg := v1alpha1.Node{NodeName: testNode.Name, SyncPeriod: metav1.Duration{Duration: time.Hour}, MinSyncPeriod: metav1.Duration{Duration: time.Millisecond}}
	n.p = &proxier{
		log: logr.Discard(),
		cfg: cfg,
		caches: caches{services: cache.NewStore(cache.DeletionHandlingMetaNamespaceKeyFunc),
			slices: cache.NewIndexer(cache.DeletionHandlingMetaNamespaceKeyFunc, cache.Indexers{byService: sliceServiceIndex})},
		node:    thisNode{log: logr.Discard(), cfg: cfg, nodes: n.nodes},
		syncers: syncers,
		model:   NewModel(),
		metrics: metrics,
		changes: changes{gauge: metrics.pendingChanges, started: time.Now()},
		udp:     udpCleaner{clean: func(_, _ map[netip.AddrPort]map[netip.AddrPort]bool) (uint, error) { return 0, nil }},
	}
	n.reg = prometheus.NewRegistry()
	n.newLoop()
	n.p.changes.request = func() { n.p.loop.Request() }
	n.p.health = newHealthServers(logr.Discard(), func() bool { return true })
	t.Cleanup(func() { n.p.health.Close(context.Background()) })
	return n
}

// newLoop gives the proxier a new loop, with no sync requested.
func (n *fakeNode) newLoop() {
	d := role.Deps{Config: &v1alpha1.Configuration{Node: n.p.cfg}, Checks: role.NewChecks(), Metrics: n.reg, Log: logr.Discard()}
	var err error
	n.p.loop, err = nodeview.NewLoop(d, "proxy", n.p.runSync)
	n.must(err)
}

// load adds the Services and slices of in, as an informer's first list.
func (n *fakeNode) load(in Input) {
	h := n.p.eventHandler()
	for _, s := range in.Services {
		n.must(n.p.caches.services.Add(s))
		h.OnAdd(s, true)
	}
	for _, ss := range in.Slices {
		for _, s := range ss {
			n.must(n.p.caches.slices.Add(s))
			h.OnAdd(s, true)
		}
	}
}

func (n *fakeNode) must(err error) {
	n.t.Helper()
	if err != nil {
		n.t.Fatal(err)
	}
}

// input is what the stores hold, with the node facts the proxier sees.
func (n *fakeNode) input() Input {
	in, err := n.p.caches.input(n.p.node.facts())
	n.must(err)
	return in
}

// converged checks that each fake's table is what a fresh build of the
// stores gives.
func (n *fakeNode) converged(step string) {
	n.t.Helper()
	want := Build(n.input())
	for fam, f := range n.fakes {
		if diff := cmp.Diff(want.Tables[fam].Dump(), f.Dump()); diff != "" {
			n.t.Errorf("%s: the %v table differs from a fresh build (-want +fake):\n%s", step, fam, diff)
		}
	}
}

// sliceOf is the first slice of the Service.
func (n *fakeNode) sliceOf(ns, name string) *sliceRecord {
	objs, err := n.p.caches.slices.ByIndex(byService, ns+"/"+name)
	n.must(err)
	return objs[0].(*sliceRecord)
}

// TestProxierSyncsItsTablesThroughTheProgrammer runs the proxier's sync on
// fake tables: a full sync programs every Service, a partial sync compares
// only what changed, and whatever the change the tables end as a fresh
// build of the caches. It is long because of the table of changes.
func TestProxierSyncsItsTablesThroughTheProgrammer(t *testing.T) {
	for _, c := range []struct {
		name   string
		change func(n *fakeNode)
		// calls are the syncs of the IPv4 table the change brings;
		// touched lists chains or sets the partial sync names, and
		// untouched some it must not name.
		calls              []string
		touched, untouched []string
		absent             string // no rule or element names it afterwards
	}{{
		name:   "nothing changed",
		change: func(*fakeNode) {},
		calls:  []string{"touched"},
	}, {
		name: "a Service's endpoint added",
		change: func(n *fakeNode) {
			old := n.sliceOf("ns1", "svc1")
			s := withEndpoint(old, "10.180.2.1")
			n.must(n.p.caches.slices.Update(s))
			n.p.eventHandler().OnUpdate(old, s)
		},
		calls:     []string{"touched"},
		touched:   []string{setHairpin, setServiceIPs},
		untouched: []string{"service-42NFTM6N-ns2/svc2/tcp/p80"},
	}, {
		name: "a Service with chains of its own deleted",
		change: func(n *fakeNode) {
			for _, o := range n.p.caches.services.List() {
				if s := o.(*serviceRecord); s.name == "svc2" {
					n.must(n.p.caches.services.Delete(s))
					n.p.eventHandler().OnDelete(s)
				}
			}
		},
		calls:   []string{"touched"},
		touched: []string{"service-42NFTM6N-ns2/svc2/tcp/p80", "external-42NFTM6N-ns2/svc2/tcp/p80"},
		absent:  "ns2/svc2",
	}, {
		// Its zone and address change every Service's rules: the model
		// starts again, and the whole table is compared.
		name: "the node's facts changed",
		change: func(n *fakeNode) {
			node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode.Name, Labels: map[string]string{v1.LabelTopologyZone: "z1"}},
				Status: v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "192.168.0.2"}}}}
			rec := nodeview.Record(node, nodeKeep)
			n.must(n.nodes.Add(rec))
			n.p.nodeHandler().OnAdd(rec, false)
		},
		calls: []string{"whole"},
	}} {
		t.Run(c.name, func(t *testing.T) {
			n := newFakeNode(t)
			n.load(overall())
			n.must(n.p.sync(true))
			n.converged("the first, full sync")
			if got := n.calls.list(); !slices.Equal(got, []string{"full"}) {
				t.Errorf("the first sync's calls %q, want one full sync", got)
			}
			c.change(n)
			n.calls.calls, n.calls.touched = nil, nil
			n.must(n.p.sync(false))
			n.converged(c.name)
			if got := n.calls.list(); !slices.Equal(got, c.calls) {
				t.Errorf("calls %q, want %q", got, c.calls)
			}
			var named []string
			for _, tc := range n.calls.touched {
				if tc != nil {
					for name := range tc.Chains {
						named = append(named, name)
					}
					for name := range tc.Sets {
						named = append(named, name)
					}
					for name := range tc.Elems {
						named = append(named, name)
					}
				}
			}
			for _, name := range c.touched {
				if !slices.Contains(named, name) {
					t.Errorf("the partial sync did not compare %s; it compared %q", name, named)
				}
			}
			for _, name := range c.untouched {
				if slices.Contains(named, name) {
					t.Errorf("the partial sync compared %s, which did not change", name)
				}
			}
			if c.absent != "" {
				for fam, f := range n.fakes {
					if strings.Contains(f.Dump(), c.absent) {
						t.Errorf("the %v table still names %s:\n%s", fam, c.absent, f.Dump())
					}
				}
			}
		})
	}
}

// TestProxierRetriesAFailedSyncAsAFullSync runs the proxier's loop: after a
// sync the programmer failed, the next one, a second later, is a full sync,
// and the tables end as a fresh build.
func TestProxierRetriesAFailedSyncAsAFullSync(t *testing.T) {
	n := newFakeNode(t)
	n.load(overall())
	n.newLoop() // without the list's requests: the loop's first sync, full, covers them
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { n.p.run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	waitCalls := func(want ...string) {
		t.Helper()
		framework.EventuallyEvery(t, 10*time.Millisecond, 5*time.Second, fmt.Sprintf("calls %q", want), func() error {
			if got := n.calls.list(); !slices.Equal(got, want) {
				return fmt.Errorf("calls %q", got)
			}
			return nil
		})
	}
	waitCalls("full")
	// The loop is idle now; the fakes are the test's until the next kick.
	n.fakes[nodeview.IPv4].Fail(errors.New("the kernel refused it"))
	old := n.sliceOf("ns1", "svc1")
	s := withEndpoint(old, "10.180.2.1")
	n.must(n.p.caches.slices.Update(s))
	n.p.eventHandler().OnUpdate(old, s)
	waitCalls("full", "touched", "full")
	cancel()
	<-done // the deferred wait finds it closed
	n.converged("after the retry")
	want := "# HELP netplane_node_sync_errors_total Syncs of a node feature that failed (retried as a full sync), by feature; the log says why.\n" +
		"# TYPE netplane_node_sync_errors_total counter\n" + `netplane_node_sync_errors_total{feature="proxy"} 1` + "\n"
	if err := testutil.GatherAndCompare(n.reg, strings.NewReader(want), "netplane_node_sync_errors_total"); err != nil {
		t.Error(err)
	}
}

// TestTheClusterCIDRsAreTheFlagsElseTheNodesPodCIDRs: the ClusterIP
// masquerade exempts --cluster-cidr; without it, every Node's pod CIDRs,
// so a Node that comes with its pod CIDRs changes the rules, and with it
// another Node changes nothing.
func TestTheClusterCIDRsAreTheFlagsElseTheNodesPodCIDRs(t *testing.T) {
	node := func(name, cidr string) any {
		return nodeview.Record(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.NodeSpec{PodCIDRs: []string{cidr}}}, nodeKeep)
	}
	for _, tc := range []struct {
		name      string
		flag      []netip.Prefix
		requested bool   // the other Node asks for a sync
		want      string // the pooled ClusterIPs' masquerade rule
	}{
		{"--cluster-cidr", []netip.Prefix{netip.MustParsePrefix("10.240.0.0/12")}, false, "ip saddr != 10.240.0.0/12 meta mark set"},
		{"no --cluster-cidr", nil, true, "ip saddr != { 10.244.1.0/24, 10.244.2.0/24 } meta mark set"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newFakeNode(t)
			n.p.node.settings = nodeview.SettingsOf(v1alpha1.Node{ClusterCIDRs: tc.flag})
			self := node(testNode.Name, "10.244.1.0/24")
			n.must(n.nodes.Add(self))
			n.load(overall())
			n.must(n.p.sync(true))
			other := node("other", "10.244.2.0/24")
			n.must(n.nodes.Add(other))
			n.p.nodeHandler().OnAdd(other, false)
			if requested := n.p.changes.pending > 0; requested != tc.requested {
				t.Errorf("another Node requested a sync: %v, want %v", requested, tc.requested)
			}
			n.must(n.p.sync(false))
			n.converged("after another Node came")
			if dump := n.fakes[nodeview.IPv4].Dump(); !strings.Contains(dump, "pick-tcp-2-pool-20 "+tc.want) {
				t.Errorf("no rule %q in the table:\n%s", tc.want, dump)
			}
		})
	}
}
