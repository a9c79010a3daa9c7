package policy

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	netv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/internal/informer"
	"github.com/netplane/netplane/internal/role"
	"github.com/netplane/netplane/nft"
)

// The feature's sync logic on the driver's fake kernel: records go in
// through the sinks as the informers would write them, syncs run as the
// runner would run them.

type fakeNode struct {
	e        *Feature
	fake     *nft.Fake
	reg      *prometheus.Registry
	events   *record.FakeRecorder
	pods     *sink
	ns       *sink
	policies *sink
	rv       int // the resourceVersion of the last write
}

func newFakeNode(t *testing.T, logDenied bool) *fakeNode {
	t.Helper()
	cfg := v1alpha1.Node{NodeName: "n1", NetworkPolicy: v1alpha1.NetworkPolicy{Enabled: true, LogDenied: logDenied}}
	cfg.SyncPeriod.Duration, cfg.MinSyncPeriod.Duration = time.Minute, 0
	f := &fakeNode{fake: nft.NewFake(TableID), reg: prometheus.NewRegistry(), events: record.NewFakeRecorder(10)}
	m := newMetrics()
	f.reg.MustRegister(m.collectors()...)
	d := role.Deps{Config: &v1alpha1.Configuration{Node: cfg}, Checks: role.NewChecks(), Metrics: f.reg, Log: logr.Discard()}
	var err error
	f.e, err = newFeature(d, f.fake, m, f.events)
	must(t, err)
	f.pods, f.ns, f.policies = &sink{e: f.e, kind: informer.Pods}, &sink{e: f.e, kind: informer.Namespaces}, &sink{e: f.e, kind: informer.NetworkPolicies}
	return f
}

func (f *fakeNode) sync(t *testing.T, full bool) {
	t.Helper()
	if err := f.e.sync(context.Background(), full); err != nil {
		t.Fatalf("sync (full=%v): %v", full, err)
	}
	if got, want := f.fake.Dump(), f.e.render.t.Dump(); got != want {
		t.Fatalf("after the sync the kernel's table differs from the desired one:\n%s", lineDiff(want, got))
	}
}

// modelWorld puts the e2e model's namespaces and pods (x and y on n1)
// into the node, as the first lists would.
func (f *fakeNode) modelWorld(t *testing.T) {
	var nss, pods []any
	for _, ns := range modelNamespaces {
		nss = append(nss, NamespaceFromAPI(modelNamespace(ns)))
		for _, name := range modelPods {
			pods = append(pods, PodFromAPI(modelPod(ns, name)))
		}
	}
	must(t, f.ns.Replace(nss, ""))
	must(t, f.pods.Replace(pods, ""))
	must(t, f.policies.Replace(nil, ""))
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func (f *fakeNode) setPolicy(t *testing.T, np *netv1.NetworkPolicy) {
	t.Helper()
	np = np.DeepCopy()
	f.rv++
	np.UID, np.ResourceVersion = types.UID("uid-"+np.Namespace+"-"+np.Name), strconv.Itoa(f.rv)
	must(t, f.policies.Update(policyRecordOf(np)))
}

var denyX = policy("x", "deny", netv1.NetworkPolicySpec{PodSelector: *all, PolicyTypes: ingressOnly})

// syncedFixture is a node with the model's pods and three policies, fully
// synced: x/* deny all ingress, x/a admits namespace y on TCP 80, x/c
// admits x's pods labelled pod=b.
func syncedFixture(t *testing.T) *fakeNode {
	t.Helper()
	f := newFakeNode(t, false)
	f.modelWorld(t)
	f.setPolicy(t, denyX)
	f.setPolicy(t, fromY(80))
	f.setPolicy(t, policy("x", "from-b", netv1.NetworkPolicySpec{PodSelector: *sel("pod", "c"),
		Ingress: []netv1.NetworkPolicyIngressRule{ingress(peers(podPeer(sel("pod", "b"))))}}))
	f.sync(t, true)
	return f
}

func fromY(p int32) *netv1.NetworkPolicy {
	return policy("x", "from-y", netv1.NetworkPolicySpec{PodSelector: *sel("pod", "a"),
		Ingress: []netv1.NetworkPolicyIngressRule{ingress(peers(nsPeer(sel("ns", "y"))), port(tcp, p))}})
}

func TestFirstSyncProgramsTheWholeTable(t *testing.T) {
	f := syncedFixture(t)
	for _, want := range []string{
		"add element inet netplane-policy ingress-pods { 10.0.1.1 : jump ingress-",
		"add element inet netplane-policy ingress-pods { 10.0.1.3 : jump ingress-",
	} {
		if !strings.Contains(f.fake.Dump(), want) {
			t.Fatalf("no %q:\n%s", want, f.fake.Dump())
		}
	}
}

// TestALaterSyncSendsOnlyTheChange: each case changes one thing on a
// freshly synced fixture and lists the steps the partial sync sends.
func TestALaterSyncSendsOnlyTheChange(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, f *fakeNode)
		want   []string // the fake's steps, hashes elided
	}{
		{"a namespace relabelled into a peer selector: the elements of its pods on another node", func(t *testing.T, f *fakeNode) {
			must(t, f.ns.Update(&Namespace{Name: "z", Labels: map[string]string{"ns": "y"}}))
		}, []string{"add sel-HASH", "add sel6-HASH"}},
		{"a pod relabelled out of a peer selector: its selector elements only", func(t *testing.T, f *fakeNode) {
			p := modelPod("x", "b")
			p.Labels = map[string]string{"pod": "b2"}
			must(t, f.pods.Update(PodFromAPI(p)))
		}, []string{"delete sel-HASH", "delete sel6-HASH"}},
		{"a label no selector reads: nothing is sent", func(t *testing.T, f *fakeNode) {
			p := modelPod("y", "b")
			p.Labels = map[string]string{"pod": "b", "extra": "1"}
			must(t, f.pods.Update(PodFromAPI(p)))
		}, nil},
		{"a local pod in a peer selector goes: its map and selector elements, and the chain no other pod uses", func(t *testing.T, f *fakeNode) {
			must(t, f.pods.Delete(PodFromAPI(modelPod("x", "b"))))
		}, []string{"delete ingress-pods6", "delete ingress-pods", "delete sel-HASH", "delete sel6-HASH", "flush chain ingress-HASH", "delete chain ingress-HASH"}},
		{"a policy's new version: a new chain, the map elements moved, the old chain gone", func(t *testing.T, f *fakeNode) {
			f.setPolicy(t, fromY(81))
		}, []string{"add chain ingress-HASH", "rewrite ingress-HASH", "delete ingress-pods", "add ingress-pods", "delete ingress-pods6", "add ingress-pods6",
			"flush chain ingress-HASH", "delete chain ingress-HASH"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := syncedFixture(t)
			tc.change(t, f)
			f.sync(t, false)
			if got := hashedSteps(f.fake.Steps()); !slices.Equal(got, tc.want) {
				t.Errorf("steps:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(tc.want, "\n  "))
			}
		})
	}
}

// value is a gauge's or counter's value.
func value(m prometheus.Metric) float64 {
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		panic(err)
	}
	if d.Gauge != nil {
		return d.Gauge.GetValue()
	}
	return d.Counter.GetValue()
}

func hashedSteps(steps []string) []string {
	var out []string
	for _, s := range steps {
		out = append(out, hashes.ReplaceAllString(s, "-HASH"))
	}
	return out
}

func TestFullSyncHealsWhatOthersChanged(t *testing.T) {
	f := newFakeNode(t, false)
	f.modelWorld(t)
	f.setPolicy(t, denyX)
	f.sync(t, true)
	want := f.fake.Dump()
	f.fake.Edit(func(t *nft.Table) *nft.Table {
		delete(t.Sets["ingress-pods"].Elements, firstKey(t.Sets["ingress-pods"].Elements))
		t.Chains["forward"].Rules = nil
		return t
	})
	f.sync(t, true)
	if got := f.fake.Dump(); got != want {
		t.Errorf("not healed:\n%s", lineDiff(want, got))
	}
	f.fake.Edit(func(*nft.Table) *nft.Table { return nil }) // nft flush ruleset
	f.sync(t, true)
	if got := f.fake.Dump(); got != want {
		t.Errorf("not remade after the table was deleted:\n%s", lineDiff(want, got))
	}
}

func firstKey(m map[string]uint32) string {
	for k := range m {
		return k
	}
	return ""
}

func TestAPolicyThatDoesNotCompileKeepsItsPreviousVersion(t *testing.T) {
	f := newFakeNode(t, false)
	f.modelWorld(t)
	good := policy("x", "p", netv1.NetworkPolicySpec{PodSelector: *all, Ingress: []netv1.NetworkPolicyIngressRule{ingress(peers(blockPeer("10.0.2.0/24")))}})
	f.setPolicy(t, good)
	f.sync(t, true)
	before := f.fake.Dump()

	bad := good.DeepCopy()
	bad.Spec.Ingress[0].From[0].IPBlock.CIDR = "10.0.2.0/33"
	f.setPolicy(t, bad)
	f.sync(t, false)
	if got := f.fake.Dump(); got != before {
		t.Errorf("a version that does not compile changed the table:\n%s", lineDiff(before, got))
	}
	wantEvent(t, f.events, "Warning InvalidNetworkPolicy not enforced on node n1: NetworkPolicy x/p: spec.ingress[0].from[0].ipBlock.cidr", "its previous version stays in force")
	if got := value(f.e.metrics.invalid); got != 1 {
		t.Errorf("invalid policies gauge %v, want 1", got)
	}

	newBad := bad.DeepCopy()
	newBad.Name = "q"
	f.setPolicy(t, newBad)
	wantEvent(t, f.events, "NetworkPolicy x/q", "nothing of it is enforced")

	f.setPolicy(t, policy("x", "p", netv1.NetworkPolicySpec{PodSelector: *all, PolicyTypes: ingressOnly}))
	must(t, f.policies.Delete(policyRecordOf(newBad)))
	f.sync(t, false)
	if got := value(f.e.metrics.invalid); got != 0 {
		t.Errorf("invalid policies gauge %v after the fix, want 0", got)
	}
	if strings.Contains(f.fake.Dump(), "10.0.2.0/24") {
		t.Errorf("the fixed version is not in force:\n%s", f.fake.Dump())
	}
}

func wantEvent(t *testing.T, events *record.FakeRecorder, parts ...string) {
	t.Helper()
	select {
	case ev := <-events.Events:
		for _, p := range parts {
			if !strings.Contains(ev, p) {
				t.Errorf("event %q does not say %q", ev, p)
			}
		}
	default:
		t.Errorf("no event; want one saying %q", parts)
	}
}

func TestARelistRemovesWhatIsGone(t *testing.T) {
	f := newFakeNode(t, false)
	f.modelWorld(t)
	f.setPolicy(t, denyX)
	f.sync(t, true)
	must(t, f.pods.Replace([]any{PodFromAPI(modelPod("x", "a"))}, ""))
	must(t, f.policies.Replace(nil, ""))
	f.sync(t, false)
	if policies, isolated := f.e.model.Counts(); policies != 0 || isolated != 0 || len(f.e.records(informer.Pods)) != 1 {
		t.Errorf("after the relist: %d policies, %d isolated pods, %d pods; want 0, 0, 1", policies, isolated, len(f.e.records(informer.Pods)))
	}
	if strings.Contains(f.fake.Dump(), "add element") {
		t.Errorf("elements left after the relist:\n%s", f.fake.Dump())
	}
}

func TestAFailedSyncIsReportedAndTheRetryHealsIt(t *testing.T) {
	f := newFakeNode(t, false)
	f.modelWorld(t)
	f.sync(t, true)
	f.setPolicy(t, denyX)
	f.fake.Fail(errors.New("the kernel said no"))
	if err := f.e.loop.Sync(context.Background(), false); err == nil {
		t.Fatal("the sync did not fail")
	}
	if got := familyValue(t, f.reg, "netplane_node_sync_errors_total"); got != 1 {
		t.Errorf("sync failures %v, want 1", got)
	}
	f.sync(t, true) // the runner retries with a full sync
	if !strings.Contains(f.fake.Dump(), "jump ingress-") {
		t.Errorf("the retry did not program the policy:\n%s", f.fake.Dump())
	}
}

func TestMetricsCountPoliciesAndSelectedPods(t *testing.T) {
	f := newFakeNode(t, false)
	f.modelWorld(t)
	f.setPolicy(t, denyX)
	f.setPolicy(t, policy("y", "a-out", netv1.NetworkPolicySpec{PodSelector: *sel("pod", "a"), PolicyTypes: egressOnly}))
	f.setPolicy(t, policy("z", "remote", netv1.NetworkPolicySpec{PodSelector: *all})) // z's pods are n2's
	f.sync(t, true)
	for name, want := range map[string]float64{"policies": 3, "selected pods": 4} {
		g := f.e.metrics.policies
		if name == "selected pods" {
			g = f.e.metrics.isolated
		}
		if got := value(g); got != want {
			t.Errorf("%s: %v, want %v", name, got, want)
		}
	}
}

// familyValue is the value of the node role's sync metric name for this
// feature, in reg.
func familyValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	must(t, err)
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if mf.GetName() == name && len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == "network-policy" {
				return m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
	}
	return 0
}

func TestDeniedPacketsCountAcrossARewrittenChain(t *testing.T) {
	reads := [][2]uint64{{5, 1}, {7, 1}, {2, 3}, {4, 3}} // the ingress chain rewritten before the third scrape
	want := []map[string]float64{{"ingress": 5, "egress": 1}, {"ingress": 7, "egress": 1}, {"ingress": 9, "egress": 3}, {"ingress": 11, "egress": 3}}
	c := &deniedCollector{desc: prometheus.NewDesc("denied", "", []string{"direction"}, nil)}
	i := 0
	c.read = func() ([2]uint64, error) { i++; return reads[i-1], nil }
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	for n, w := range want {
		mfs, err := reg.Gather()
		must(t, err)
		got := map[string]float64{}
		for _, m := range mfs[0].Metric {
			got[m.Label[0].GetValue()] = m.Counter.GetValue()
		}
		if !maps.Equal(got, w) {
			t.Errorf("scrape %d: %v, want %v", n+1, got, w)
		}
	}
}

// The deny chains' counters are read through the driver that programs the
// table: none before the table is there, the chains' counts after.
func TestDeniedPacketsAreReadThroughTheDriver(t *testing.T) {
	f := newFakeNode(t, false)
	f.fake.Count(denyChain(Ingress), 4)
	f.fake.Count(denyChain(Egress), 2)
	for _, tc := range []struct {
		name string
		sync bool
		want map[string]float64
	}{
		{"no table yet", false, map[string]float64{"ingress": 0, "egress": 0}},
		{"after a sync", true, map[string]float64{"ingress": 4, "egress": 2}},
	} {
		if tc.sync {
			f.modelWorld(t)
			f.sync(t, true)
		}
		mfs, err := f.reg.Gather()
		must(t, err)
		got := map[string]float64{}
		for _, mf := range mfs {
			if mf.GetName() == "netplane_network_policy_denied_packets_total" {
				for _, m := range mf.Metric {
					got[m.Label[0].GetValue()] = m.Counter.GetValue()
				}
			}
		}
		if !maps.Equal(got, tc.want) {
			t.Errorf("%s: denied %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestDisabledRemovesTheTable(t *testing.T) {
	f := newFakeNode(t, false)
	f.modelWorld(t)
	f.setPolicy(t, denyX)
	f.sync(t, true)
	off := &Feature{log: logr.Discard(), cfg: v1alpha1.Node{NetworkPolicy: v1alpha1.NetworkPolicy{Enabled: false}},
		deleteTable: func() error { f.fake.Edit(func(*nft.Table) *nft.Table { return nil }); return nil }}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	must(t, off.Run(ctx))
	if got := f.fake.Dump(); got != "" {
		t.Errorf("the table is still there:\n%s", got)
	}
}

func TestLoggingAddsTheNFLOGRuleToTheDenyChains(t *testing.T) {
	f := newFakeNode(t, true)
	f.sync(t, true)
	for _, d := range []string{"ingress", "egress"} {
		want := "add rule inet netplane-policy deny-" + d + ` limit rate 10/second burst 5 packets log prefix "netplane-policy denied ` + d + ` " group 27041 snaplen 128`
		if !strings.Contains(f.fake.Dump(), want+"\n") {
			t.Errorf("no NFLOG rule in deny-%s:\n%s", d, f.fake.Dump())
		}
	}
}
