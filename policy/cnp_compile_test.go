package policy

import (
	"fmt"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// describe is a compiled policy in one line per rule: what the model makes
// chains of.
func describe(p *ClusterPolicy) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s/%d", p.Name, p.Tier, p.Priority)
	for _, d := range directions {
		for _, r := range p.Rules[d] {
			fmt.Fprintf(&b, "\n%s[%d] %s peers=%d", d, r.Index, r.Action, len(r.Peers))
			for _, port := range r.Ports {
				fmt.Fprintf(&b, " %d:%d-%d%s", port.Protocol, port.Port, port.EndPort, port.Name)
			}
			if r.Closed {
				b.WriteString(" closed")
			}
		}
	}
	return b.String()
}

func TestCompileClusterReadsWhatTheAPIStates(t *testing.T) {
	domain := cnpv1.ClusterNetworkPolicyEgressPeer{DomainNames: []cnpv1.DomainName{"example.com"}}
	twoPeers := cnpv1.ClusterNetworkPolicyEgressPeer{Namespaces: &metav1.LabelSelector{}, Networks: []cnpv1.CIDR{"10.0.0.0/8"}}
	for _, tc := range []struct {
		name     string
		p        *cnpv1.ClusterNetworkPolicy
		want     string // describe's; "" when it does not compile
		problems []string
		err      string
	}{
		{"rules in order, actions, ports and ranges, networks as one peer per CIDR",
			to(from(admin("a", 7, inNamespace("x")), actPass, cnpPeers(nsPeerOf("y")), tcpPort(80), udpRange(1000, 2000), namedPortOf("web")),
				actAccept, cnpPeers(networks("10.0.0.0/8", "fd00::/8"), podPeerOf("y", "b"))),
			"a Admin/7\ningress[0] Pass peers=1 6:80-80 17:1000-2000 0:0-0web\negress[0] Accept peers=3", nil, ""},
		{"baseline tier",
			from(baseline("b", 0, podsOf("x", "a")), actDeny, cnpPeers(nsPeerOf("y"))), "b Baseline/0\ningress[0] Deny peers=1", nil, ""},
		{"a Deny with an unknown peer denies everything",
			to(admin("c", 1, inNamespace("x")), actDeny, cnpPeers(nsPeerOf("y"), cnpv1.ClusterNetworkPolicyEgressPeer{})),
			"c Admin/1\negress[0] Deny peers=0 closed", []string{"spec.egress[0].to[1]: no field this node knows is set: an unknown peer: the rule fails closed and denies every connection"}, ""},
		{"a Pass with an unknown protocol denies everything",
			from(admin("d", 1, inNamespace("x")), actPass, cnpPeers(nsPeerOf("y")), cnpv1.ClusterNetworkPolicyProtocol{}),
			"d Admin/1\ningress[0] Deny peers=0 closed", []string{"spec.ingress[0].protocols[0]: 0 fields this node knows are set, not one: an unknown protocol"}, ""},
		{"an Accept of domain names matches nothing",
			to(to(admin("e", 1, inNamespace("x")), actAccept, cnpPeers(domain)), actDeny, cnpPeers(nsPeerOf("y"))),
			"e Admin/1\negress[1] Deny peers=1", []string{"spec.egress[0].to[0].domainNames: not enforced by netplane: the rule fails closed and matches nothing"}, ""},
		{"a peer of two fields is unknown",
			to(admin("f", 1, inNamespace("x")), actDeny, cnpPeers(twoPeers)),
			"f Admin/1\negress[0] Deny peers=0 closed", []string{"spec.egress[0].to[0]: 2 fields set, not one"}, ""},
		{"an unknown tier", cnpObject("g", "Middle", 1, inNamespace("x")), "", nil, `spec.tier: unknown tier "Middle"`},
		{"a subject with no field", admin("h", 1, cnpv1.ClusterNetworkPolicySubject{}), "", nil, "spec.subject: no field this node knows is set"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := CompileCluster(tc.p)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d := describe(got); d != tc.want {
				t.Errorf("compiled:\n%s\nwant:\n%s", d, tc.want)
			}
			if len(got.Problems) != len(tc.problems) {
				t.Fatalf("problems %q, want %q", got.Problems, tc.problems)
			}
			for i, p := range tc.problems {
				if !strings.Contains(got.Problems[i], p) {
					t.Errorf("problem %q does not say %q", got.Problems[i], p)
				}
			}
		})
	}
}
