package lab

import "testing"

// What each family gives the cluster: the primary family first, nothing
// of a family the cluster lacks (kube-controller-manager refuses a mask
// flag of a missing family, the API server a second service CIDR).
func TestTheFamilyDecidesTheClustersAddresses(t *testing.T) {
	n := &Node{IP: "172.30.0.11", IP6: "fd00:172:30::11"}
	for _, tc := range []struct {
		family, services, pods, dns, api, nodeIPs string
	}{
		{"", "10.96.0.0/16,fd00:10:96::/112", "10.244.0.0/16,fd00:10:244::/56", "10.96.0.10", "https://172.30.0.2:6443", "172.30.0.11,fd00:172:30::11"},
		{FamilyIPv4, "10.96.0.0/16", "10.244.0.0/16", "10.96.0.10", "https://172.30.0.2:6443", "172.30.0.11"},
		{FamilyIPv6, "fd00:10:96::/112", "fd00:10:244::/56", "fd00:10:96::a", "https://[fd00:172:30::2]:6443", "fd00:172:30::11"},
	} {
		t.Run(tc.family, func(t *testing.T) {
			t.Setenv("NETPLANE_LAB_IP_FAMILY", "")
			c := Config{Family: tc.family}
			if err := c.completeFamily(); err != nil {
				t.Fatal(err)
			}
			got := []string{c.ServiceCIDRs(), c.ClusterCIDRs(), c.DNSServiceIP(), c.APIServerURL(), c.NodeIPs(n)}
			want := []string{tc.services, tc.pods, tc.dns, tc.api, tc.nodeIPs}
			for i := range got {
				if got[i] != want[i] {
					t.Errorf("%s: got %q, want %q", []string{"services", "pods", "dns", "api", "node IPs"}[i], got[i], want[i])
				}
			}
		})
	}
	if err := (&Config{Family: "ipv5"}).completeFamily(); err == nil {
		t.Error("an unknown family is accepted")
	}
}
