package policy

import (
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/kubernetes/fake"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/netplane/netplane/internal/informer"
)

func TestClusterPoliciesAreWatchedOnlyWhenTheirCRDIsServed(t *testing.T) {
	c := fake.NewClientset()
	d := c.Discovery().(*fakediscovery.FakeDiscovery)
	if served, err := clusterServed(d); err != nil || served {
		t.Fatalf("no CRD: served=%v err=%v, want false and no error", served, err)
	}
	d.Resources = []*metav1.APIResourceList{{GroupVersion: "policy.networking.k8s.io/v1alpha2",
		APIResources: []metav1.APIResource{{Name: "clusternetworkpolicies"}}}}
	if served, _ := clusterServed(d); served {
		t.Fatal("v1alpha2 only: served, want not (the node reads v1beta1)")
	}
	d.Resources = append(d.Resources, &metav1.APIResourceList{GroupVersion: "policy.networking.k8s.io/v1beta1",
		APIResources: []metav1.APIResource{{Name: "clusternetworkpolicies"}, {Name: "clusternetworkpolicies/status"}}})
	if served, err := clusterServed(d); err != nil || !served {
		t.Fatalf("v1beta1 served: served=%v err=%v, want true", served, err)
	}
}

func (f *fakeNode) setCNP(t *testing.T, p *cnpv1.ClusterNetworkPolicy) {
	t.Helper()
	f.rv++
	p = p.DeepCopy()
	p.ResourceVersion = strconv.Itoa(f.rv)
	must(t, (&sink{f.e, clusterPolicies}).Update(clusterRecordOf(p)))
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
	must(t, (&sink{f.e, clusterPolicies}).Replace(nil, ""))
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
	must(t, (&sink{f.e, clusterPolicies}).Update(clusterRecordOf(p))) // the same version again
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
	nodes := &sink{f.e, informer.Nodes}
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
