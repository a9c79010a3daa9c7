package lab

import (
	"strings"
	"testing"
)

// The upstream stack's masquerade has a rule for each family the cluster
// has and none for a family it lacks (nft refuses no such rule, but a pod
// of an IPv6 cluster must leave it as its node's IPv6 address).
func TestTheUpstreamStackMasqueradesTheClustersFamilies(t *testing.T) {
	for _, tc := range []struct {
		family    string
		want, not []string
	}{
		{FamilyDual, []string{"ip saddr 10.244.0.0/16 ip daddr != 10.244.0.0/16", "ip6 saddr fd00:10:244::/56 ip6 daddr != fd00:10:244::/56"}, nil},
		{FamilyIPv4, []string{"ip saddr 10.244.0.0/16"}, []string{"ip6 "}},
		{FamilyIPv6, []string{"ip6 saddr fd00:10:244::/56 ip6 daddr != fd00:10:244::/56 oifname \"eth0\" masquerade"}, []string{"ip saddr"}},
	} {
		t.Run(tc.family, func(t *testing.T) {
			got := masquerade(strings.Split(Config{Family: tc.family}.ClusterCIDRs(), ","))
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("no %q in\n%s", w, got)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(got, n) {
					t.Errorf("%q in\n%s", n, got)
				}
			}
		})
	}
	for cidr, want := range map[string]string{"10.244.1.0/24": "0.0.0.0/0", "fd00:10:244:1::/64": "::/0"} {
		if got := defaultRoute(cidr); got != want {
			t.Errorf("defaultRoute(%s) = %s, want %s", cidr, got, want)
		}
	}
}
