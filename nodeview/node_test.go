package nodeview

import (
	"fmt"
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestOfKeepsTheFirstAddressesPerFamilyPodCIDRsAndWhatTheViewAsks(t *testing.T) {
	now := metav1.Now()
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", DeletionTimestamp: &now,
		Labels:      map[string]string{v1.LabelTopologyZone: "z1", "other": "x"},
		Annotations: map[string]string{"a": "1", "b": "2"}},
		Spec: v1.NodeSpec{PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.7/24", "fd00:10:244:1::/64", "bogus"},
			Taints: []v1.Taint{{Key: "t", Effect: v1.TaintEffectNoSchedule}, {Key: "u", Effect: v1.TaintEffectNoExecute}}},
		Status: v1.NodeStatus{Addresses: []v1.NodeAddress{
			{Type: v1.NodeExternalIP, Address: "203.0.113.1"},
			{Type: v1.NodeInternalIP, Address: "192.168.10.11"},
			{Type: v1.NodeInternalIP, Address: "192.168.10.99"},
			{Type: v1.NodeInternalIP, Address: "fd00:a::11"},
			{Type: v1.NodeHostName, Address: "n"},
		}}}
	for _, tc := range []struct {
		name string
		keep Keep
		want string
	}{
		{"nothing asked", Keep{}, "{n [192.168.10.11 fd00:a::11] [203.0.113.1] [10.244.1.0/24 fd00:10:244:1::/64] true map[] map[] []}"},
		{"a label, an annotation and a taint asked", Keep{Labels: []string{v1.LabelTopologyZone, "absent"}, Annotations: []string{"b"}, Taints: []string{"u"}},
			"{n [192.168.10.11 fd00:a::11] [203.0.113.1] [10.244.1.0/24 fd00:10:244:1::/64] true map[topology.kubernetes.io/zone:z1] map[b:2] [{u  NoExecute <nil>}]}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := fmt.Sprint(Of(n, tc.keep)); got != tc.want {
				t.Errorf("Of = %s, want %s", got, tc.want)
			}
		})
	}
	n.Spec.PodCIDRs = nil
	if got := Of(n, Keep{}).PodCIDRs; len(got) != 1 || got[0].String() != "10.244.1.0/24" {
		t.Errorf("without spec.podCIDRs: %v, want spec.podCIDR", got)
	}
}

func TestPrimaryIPsAreTheInternalIPElseTheExternalIPPerFamily(t *testing.T) {
	a := netip.MustParseAddr
	for _, tc := range []struct {
		name string
		n    Node
		want string
	}{
		{"internal wins", Node{IPs: []netip.Addr{a("10.0.0.1")}, ExternalIPs: []netip.Addr{a("203.0.113.1")}}, "[10.0.0.1]"},
		{"external where no internal of the family", Node{IPs: []netip.Addr{a("fd00::1")}, ExternalIPs: []netip.Addr{a("203.0.113.1")}}, "[203.0.113.1 fd00::1]"},
		{"none", Node{}, "[]"},
	} {
		if got := fmt.Sprint(tc.n.PrimaryIPs()); got != tc.want {
			t.Errorf("%s: PrimaryIPs = %s, want %s", tc.name, got, tc.want)
		}
	}
}
