package policy

import (
	"context"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	cnpfake "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned/fake"
	cnpclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned/typed/apis/v1beta1"

	"github.com/netplane/netplane/internal/informer"
	"github.com/netplane/netplane/internal/outage"
)

func TestTheCRDServesClusterPoliciesOnlyEstablishedWithV1beta1Served(t *testing.T) {
	now := metav1.Now()
	for _, tc := range []struct {
		name string
		edit func(*apiextensionsv1.CustomResourceDefinition)
		want bool
	}{
		{"established, v1beta1 served", func(*apiextensionsv1.CustomResourceDefinition) {}, true},
		{"not established yet", func(c *apiextensionsv1.CustomResourceDefinition) {
			c.Status.Conditions[1].Status = apiextensionsv1.ConditionFalse
		}, false},
		{"v1beta1 not served", func(c *apiextensionsv1.CustomResourceDefinition) { c.Spec.Versions[1].Served = false }, false},
		{"v1alpha2 only", func(c *apiextensionsv1.CustomResourceDefinition) { c.Spec.Versions = c.Spec.Versions[:1] }, false},
		{"being deleted", func(c *apiextensionsv1.CustomResourceDefinition) { c.DeletionTimestamp = &now }, false},
		{"another CRD", func(c *apiextensionsv1.CustomResourceDefinition) {
			c.Name = "adminnetworkpolicies.policy.networking.k8s.io"
		}, false},
	} {
		crd := servedCRD()
		tc.edit(crd)
		if got := crdRecordOf(crd).served; got != tc.want {
			t.Errorf("%s: served=%v, want %v", tc.name, got, tc.want)
		}
	}
}

func servedCRD() *apiextensionsv1.CustomResourceDefinition {
	return &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: crdName},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{Versions: []apiextensionsv1.CustomResourceDefinitionVersion{
			{Name: "v1alpha2", Served: true}, {Name: "v1beta1", Served: true, Storage: true}}},
		Status: apiextensionsv1.CustomResourceDefinitionStatus{Conditions: []apiextensionsv1.CustomResourceDefinitionCondition{
			{Type: apiextensionsv1.NamesAccepted, Status: apiextensionsv1.ConditionTrue},
			{Type: apiextensionsv1.Established, Status: apiextensionsv1.ConditionTrue}}}}
}

// TestClusterPolicyEnforcementFollowsTheCRD: the CRD served, its policies
// are read and enforced; no longer served, they leave the table, which is
// NetworkPolicy's again, and what the stopped reflector still hands on is
// dropped. The first sync waits for the policies when the CRD is served.
func TestClusterPolicyEnforcementFollowsTheCRD(t *testing.T) {
	for _, servedAtStart := range []bool{false, true} {
		f := syncedFixture(t)
		before := f.fake.Dump()
		w := f.crdWatch(t, denyFromY)
		must(t, w.Replace([]any{&crdRecord{served: servedAtStart}}, ""))
		<-w.Done()
		if !servedAtStart {
			if n := f.clusterPolicies(); n != 0 {
				t.Fatalf("no CRD: %d ClusterNetworkPolicies in the model", n)
			}
			<-w.set(true).Done()
		}
		if n := f.clusterPolicies(); n != 1 {
			t.Fatalf("served at start=%v: %d ClusterNetworkPolicies in the model once listed, want 1", servedAtStart, n)
		}
		f.sync(t, false)
		if !strings.Contains(f.fake.Dump(), "chain inet netplane-policy admin-ingress-") {
			t.Fatalf("served at start=%v: no Admin chain in the table:\n%s", servedAtStart, f.fake.Dump())
		}
		old := w.sink
		bad := denyFromY.DeepCopy()
		bad.Name, bad.Spec.Tier = "bad-tier", "Middle"
		must(t, old.Add(clusterRecordOf(bad))) // never compiles: reported, not in the model
		must(t, w.Delete(&crdRecord{}))
		must(t, old.Add(clusterRecordOf(denyFromY)))
		if n := len(f.e.clusterReported); n != 0 {
			t.Errorf("served at start=%v: the CRD gone, %d policies still remembered as reported", servedAtStart, n)
		}
		f.sync(t, false)
		if got := f.fake.Dump(); got != before {
			t.Errorf("served at start=%v: the CRD gone, the table is not NetworkPolicy's:\n%s", servedAtStart, lineDiff(before, got))
		}
	}
}

// The CRD served at start and gone before its policies were listed: the
// first sync waits no longer, there being none to wait for.
func TestTheFirstSyncDoesNotWaitForPoliciesWhoseCRDWentAway(t *testing.T) {
	f := syncedFixture(t)
	api := cnpfake.NewSimpleClientset()
	listing := make(chan struct{}, 10)
	api.PrependReactor("list", "clusternetworkpolicies", func(k8stesting.Action) (bool, runtime.Object, error) {
		listing <- struct{}{}
		<-t.Context().Done() // the API server never answers
		return true, nil, context.Canceled
	})
	w := f.crdWatchOf(t, api)
	must(t, w.Replace([]any{&crdRecord{served: true}}, ""))
	<-listing
	must(t, w.Delete(&crdRecord{}))
	select {
	case <-w.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the first sync still waits for the policies of a CRD gone")
	}
}

// crdWatch is the feature's CRD watch with an API server holding pols.
func (f *fakeNode) crdWatch(t *testing.T, pols ...*cnpv1.ClusterNetworkPolicy) *crdWatch {
	objs := make([]runtime.Object, len(pols))
	for i, p := range pols {
		objs[i] = p.DeepCopy()
	}
	return f.crdWatchOf(t, cnpfake.NewSimpleClientset(objs...))
}

func (f *fakeNode) crdWatchOf(t *testing.T, api *cnpfake.Clientset) *crdWatch {
	gate := outage.New(outage.DefaultPolicy, outage.Readyz(nil), logr.Discard())
	f.e.deps.Factory = informer.NewWithGate(fake.NewClientset(), gate)
	f.e.crd = &crdWatch{e: f.e, ctx: t.Context(), policies: fakeWithoutWatchList{api.PolicyV1beta1()}, synced: make(chan struct{})}
	return f.e.crd
}

// fakeWithoutWatchList says the fake cannot stream a list as a watch, as
// client-go's own fakes say.
type fakeWithoutWatchList struct {
	cnpclient.PolicyV1beta1Interface
}

func (fakeWithoutWatchList) IsWatchListSemanticsUnSupported() bool { return true }

func (f *fakeNode) clusterPolicies() int {
	f.e.mu.Lock()
	defer f.e.mu.Unlock()
	return len(f.e.records(clusterPolicies))
}

func (f *fakeNode) setCNP(t *testing.T, p *cnpv1.ClusterNetworkPolicy) {
	t.Helper()
	f.rv++
	p = p.DeepCopy()
	p.ResourceVersion = strconv.Itoa(f.rv)
	must(t, (&sink{e: f.e, kind: clusterPolicies}).Update(clusterRecordOf(p)))
}

var denyFromY = func() *cnpv1.ClusterNetworkPolicy {
	p := cnpObject("deny-from-y", cnpv1.AdminTier, 10, cnpv1.ClusterNetworkPolicySubject{Namespaces: sel("ns", "x")})
	p.Spec.Ingress = []cnpv1.ClusterNetworkPolicyIngressRule{{Action: cnpv1.ClusterNetworkPolicyRuleActionDeny,
		From: []cnpv1.ClusterNetworkPolicyIngressPeer{{Namespaces: sel("ns", "y")}}}}
	return p
}()

// TestClusterPolicyRecordsReachTheKernelAndGoAgain: a ClusterNetworkPolicy
// through its sink gives x's pods an Admin chain in the kernel; deleted,
// the table is NetworkPolicy's again, and a relist without it removes it.
func TestClusterPolicyRecordsReachTheKernelAndGoAgain(t *testing.T) {
	f := syncedFixture(t)
	before := f.fake.Dump()
	f.setCNP(t, denyFromY)
	f.sync(t, false)
	dump := f.fake.Dump()
	for _, want := range []string{"ingress-pods { 10.0.1.1 : jump admin-ingress-", "ingress-pods { 10.0.1.2 : jump admin-ingress-", "chain inet netplane-policy deny-ingress-"} {
		if !strings.Contains(dump, want) {
			t.Errorf("no %q:\n%s", want, dump)
		}
	}
	must(t, (&sink{e: f.e, kind: clusterPolicies}).Replace(nil, ""))
	f.sync(t, false)
	if got := f.fake.Dump(); got != before {
		t.Errorf("a relist without the policy left a table other than NetworkPolicy's:\n%s", lineDiff(before, got))
	}
}

// TestARuleWithAnUnknownPeerFailsClosedWithAWarning: a Deny rule whose
// peer has no field this build knows denies every connection of its
// direction, and the policy gets a Warning event saying so, once a
// version.
func TestARuleWithAnUnknownPeerFailsClosedWithAWarning(t *testing.T) {
	f := syncedFixture(t)
	p := denyFromY.DeepCopy()
	p.Spec.Ingress[0].From = append(p.Spec.Ingress[0].From, cnpv1.ClusterNetworkPolicyIngressPeer{})
	f.setCNP(t, p)
	f.sync(t, false)
	wantEvent(t, f.events, "Warning ClusterNetworkPolicyRuleFailedClosed", "spec.ingress[0].from[1]", "unknown peer", "denies every connection")
	tr := f.e.model.Table().Trace(Packet{Hook: "forward", Src: addr("10.0.3.1"), Dst: addr("10.0.1.1"), Proto: 6, Port: 80})
	if tr.Accepted {
		t.Errorf("z/a -> x/a passed a rule failed closed:\n%s", strings.Join(tr.Steps, "\n"))
	}
	p.ResourceVersion = strconv.Itoa(f.rv)
	must(t, (&sink{e: f.e, kind: clusterPolicies}).Update(clusterRecordOf(p))) // the same version again
	select {
	case ev := <-f.events.Events:
		t.Errorf("a second event for the same version: %s", ev)
	default:
	}
}

func TestNodeRecordsFillTheNodesPeer(t *testing.T) {
	f := syncedFixture(t)
	p := cnpObject("no-nodes", cnpv1.AdminTier, 1, cnpv1.ClusterNetworkPolicySubject{Namespaces: sel("ns", "x")})
	p.Spec.Egress = []cnpv1.ClusterNetworkPolicyEgressRule{{Action: cnpv1.ClusterNetworkPolicyRuleActionDeny,
		To: []cnpv1.ClusterNetworkPolicyEgressPeer{{Nodes: &metav1.LabelSelector{}}}}}
	f.setCNP(t, p)
	nodes := &sink{e: f.e, kind: informer.Nodes}
	must(t, nodes.Replace([]any{&Node{Name: "n1", IPs: []netip.Addr{addr("192.0.2.10")}}}, ""))
	f.sync(t, false)
	out := Packet{Hook: "forward", Src: addr("10.0.1.1"), Dst: addr("192.0.2.10"), Proto: 6, Port: 22}
	if f.e.model.Table().Trace(out).Accepted {
		t.Error("x/a reached node n1's address past a Deny to every node")
	}
	must(t, nodes.Replace(nil, ""))
	f.sync(t, false)
	if !f.e.model.Table().Trace(out).Accepted {
		t.Error("x/a cannot reach 192.0.2.10 once it is no node's")
	}
}

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }

// TestTheDenyLogNamesTheClusterPolicyAndItsTier: a policy's deny chain
// logs with a prefix naming its tier and name (cut to what the kernel
// keeps), which the log line reads back.
func TestTheDenyLogNamesTheClusterPolicyAndItsTier(t *testing.T) {
	long := strings.Repeat("n", 200)
	for _, tc := range []struct {
		tier   Tier
		name   string
		wantBy string
	}{
		{AdminTier, "deny-from-y", "Admin:deny-from-y"},
		{BaselineTier, "default-deny", "Baseline:default-deny"},
		{AdminTier, long, "Admin:" + long[:maxLogPrefix-len(logPrefix+"ingress Admin:")-1]},
	} {
		prefix := clusterLogPrefix(logPrefix, Ingress, &ClusterPolicy{Name: tc.name, Tier: tc.tier})
		if len(prefix) > maxLogPrefix {
			t.Errorf("%s: prefix of %d bytes, the kernel keeps %d", tc.name, len(prefix), maxLogPrefix)
		}
		attrs, err := netlink.MarshalAttributes([]netlink.Attribute{
			{Type: nfulaPrefix, Data: append([]byte(prefix), 0)},
			{Type: nfulaPayload, Data: ipv4(6, "10.0.2.1", "10.0.1.1", 0, ports4000to80)},
		})
		must(t, err)
		m := netlink.Message{Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_ULOG<<8 | nfulnlMsgPacket)},
			Data: append([]byte{unix.AF_INET, 0, 0, 0}, attrs...)}
		p, ok := parseNFLOG(m)
		if !ok || p.By != tc.wantBy || p.Dir != Ingress {
			t.Errorf("%s: parsed ok=%v dir=%v by %q, want ingress by %q", tc.name, ok, p.Dir, p.By, tc.wantBy)
		}
	}
}
