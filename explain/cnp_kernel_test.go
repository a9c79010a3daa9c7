package explain

import (
	"net/netip"
	"strings"
	"testing"

	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/netplane/netplane/nft"
	"github.com/netplane/netplane/policy"
)

// tableKernel is a kernel that holds one table and nothing else.
type tableKernel struct {
	Kernel
	t *nft.Table
}

func (k tableKernel) Table(nft.TableID) (*nft.Table, error) { return k.t, nil }

// kernelOf is the model's table as the kernel would hold its sets and
// chains (names and elements; checkPolicy reads no more).
func kernelOf(want *policy.Table) *nft.Table {
	t := nft.NewTable(policy.TableID.Family, policy.TableID.Name)
	for name := range want.Chains {
		t.Chains[name] = &nft.Chain{Name: name}
	}
	for name, s := range want.Sets {
		ns := &nft.Set{Name: name, Elements: map[string]uint32{}}
		for e := range s.All() {
			ns.Elements[policy.ElementID(s, e)] = 1
		}
		t.Sets[name] = ns
	}
	return t
}

// TestKernelCheckSeesAStaleTierElement: a pod's verdict map element left
// pointing at an Admin chain the model no longer sends it to is a
// difference, as a stale group chain's is.
func TestKernelCheckSeesAStaleTierElement(t *testing.T) {
	in := world(podC, podB, 8080)
	in.ClusterPolicies = []*cnpv1.ClusterNetworkPolicy{cnp("no-y", cnpv1.AdminTier, 1, "x", fromNS(cnpv1.ClusterNetworkPolicyRuleActionDeny, "", "y"))}
	j, err := newJudge(in.Pods, in.Namespaces, in.Policies)
	if err != nil {
		t.Fatal(err)
	}
	if err := j.addCluster(in.ClusterPolicies, in.Nodes); err != nil {
		t.Fatal(err)
	}
	want := j.model("n2").Table()
	b := netip.MustParseAddr("10.244.2.10")
	addrs := map[netip.Addr]bool{b: true}
	var out KernelReport
	if err := checkPolicy(tableKernel{t: kernelOf(want)}, want, addrs, &out); err != nil || len(out.Differences) > 0 {
		t.Fatalf("the model's own table: %v %v", err, out.Differences)
	}
	// The kernel still sends x/b to an Admin chain of an older version.
	k := kernelOf(want)
	k.Chains["admin-ingress-0123456789abcdef"] = &nft.Chain{Name: "admin-ingress-0123456789abcdef"}
	stale := policy.Element{Addr: b, Chain: "admin-ingress-0123456789abcdef"}
	k.Sets["ingress-pods"].Elements[policy.ElementID(want.Sets["ingress-pods"], stale)] = 1
	out = KernelReport{}
	if err := checkPolicy(tableKernel{t: k}, want, addrs, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(out.Differences, "\n"), "holds 10.244.2.10 : jump admin-ingress-0123456789abcdef") {
		t.Errorf("differences %q do not name the stale element", out.Differences)
	}
}
