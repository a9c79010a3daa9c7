package explain

import (
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

func cnp(name string, tier cnpv1.Tier, prio int32, ns string, ingress ...cnpv1.ClusterNetworkPolicyIngressRule) *cnpv1.ClusterNetworkPolicy {
	return &cnpv1.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: cnpv1.ClusterNetworkPolicySpec{Tier: tier, Priority: prio,
		Subject: cnpv1.ClusterNetworkPolicySubject{Namespaces: &metav1.LabelSelector{MatchLabels: map[string]string{"ns": ns}}}, Ingress: ingress}}
}

func fromNS(action cnpv1.ClusterNetworkPolicyRuleAction, name, ns string) cnpv1.ClusterNetworkPolicyIngressRule {
	return cnpv1.ClusterNetworkPolicyIngressRule{Name: name, Action: action,
		From: []cnpv1.ClusterNetworkPolicyIngressPeer{{Namespaces: &metav1.LabelSelector{MatchLabels: map[string]string{"ns": ns}}}}}
}

// TestClusterNetworkPolicyTiers: explain names the tier, the policy, the
// rule and its action that decide, in the order the table judges (Admin,
// then NetworkPolicy when it isolates, then Baseline), and its reading
// agrees with the model's table.
func TestClusterNetworkPolicyTiers(t *testing.T) {
	denyAll := netpol("x", "deny-all", nil, ingressOnly, nil, nil)
	adminDenyY := cnp("no-y", cnpv1.AdminTier, 5, "x", fromNS(cnpv1.ClusterNetworkPolicyRuleActionAccept, "", "x"), fromNS(cnpv1.ClusterNetworkPolicyRuleActionDeny, "block-y", "y"))
	adminAcceptY := cnp("yes-y", cnpv1.AdminTier, 1, "x", fromNS(cnpv1.ClusterNetworkPolicyRuleActionAccept, "", "y"))
	adminPassY := cnp("pass-y", cnpv1.AdminTier, 1, "x", fromNS(cnpv1.ClusterNetworkPolicyRuleActionPass, "", "y"))
	baseDenyY := cnp("base-no-y", cnpv1.BaselineTier, 1, "x", fromNS(cnpv1.ClusterNetworkPolicyRuleActionDeny, "", "y"))
	cases := []struct {
		name    string
		in      *Input
		verdict string
		text    string
		effect  PolicyEffect
	}{
		{"Admin Deny, second rule", world(podC, podB, 8080), Denied, `denied by Admin ClusterNetworkPolicy no-y (rule 2 "block-y")`,
			PolicyEffect{Name: "no-y", Tier: "Admin", Direction: DirIngress, Effect: Denies, Rule: 2}},
		{"Admin Accept over a NetworkPolicy", world(podC, podB, 8080, denyAll), Allowed, "accepted by Admin ClusterNetworkPolicy yes-y (rule 1)",
			PolicyEffect{Name: "yes-y", Tier: "Admin", Direction: DirIngress, Effect: Accepts, Rule: 1}},
		{"Admin Pass to a NetworkPolicy", world(podC, podB, 8080, denyAll), Denied, "passed by Admin ClusterNetworkPolicy pass-y (rule 1); denied: isolated by x/deny-all",
			PolicyEffect{Name: "pass-y", Tier: "Admin", Direction: DirIngress, Effect: Passes, Rule: 1}},
		{"Baseline Deny", world(podC, podB, 8080), Denied, "denied by Baseline ClusterNetworkPolicy base-no-y (rule 1)",
			PolicyEffect{Name: "base-no-y", Tier: "Baseline", Direction: DirIngress, Effect: Denies, Rule: 1}},
		{"Baseline under an isolating NetworkPolicy says nothing", world(podC, podB, 8080, denyAll), Denied, "isolated by x/deny-all",
			PolicyEffect{Namespace: "x", Name: "deny-all", Direction: DirIngress, Effect: Isolates}},
	}
	pols := [][]*cnpv1.ClusterNetworkPolicy{{adminDenyY}, {adminAcceptY}, {adminPassY, adminAcceptY2()}, {baseDenyY}, {baseDenyY}}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.in.ClusterPolicies = pols[i]
			x, err := Explain(c.in)
			if err != nil {
				t.Fatal(err)
			}
			b := x.Backends[0]
			if b.Verdict != c.verdict {
				t.Errorf("verdict %s, want %s: %s | %s", b.Verdict, c.verdict, b.Egress, b.Ingress)
			}
			if !strings.Contains(b.Ingress, c.text) {
				t.Errorf("ingress %q, want %q", b.Ingress, c.text)
			}
			if strings.Contains(b.Ingress, "model") {
				t.Errorf("the model's table and the reading disagree: %s", b.Ingress)
			}
			if !slices.Contains(b.Policies, c.effect) {
				t.Errorf("policies %+v lack %+v", b.Policies, c.effect)
			}
		})
	}
}

// adminAcceptY2 accepts y at a lower precedence than pass-y: Pass skips it.
func adminAcceptY2() *cnpv1.ClusterNetworkPolicy {
	return cnp("yes-y-later", cnpv1.AdminTier, 9, "x", fromNS(cnpv1.ClusterNetworkPolicyRuleActionAccept, "", "y"))
}
