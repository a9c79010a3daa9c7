package proxy

import (
	"net/netip"
	"slices"
	"testing"
)

// TestExternalForFollowsTheExternalChain: who reaches which endpoints of a
// NodePort, externalIP or load-balancer address, and who is masqueraded,
// as externalChain writes it.
func TestExternalForFollowsTheExternalChain(t *testing.T) {
	all := []netip.AddrPort{netip.MustParseAddrPort("10.244.1.5:80"), netip.MustParseAddrPort("10.244.2.5:80")}
	local := all[:1]
	cases := []struct {
		name       string
		c          PortChoice
		pod, node  bool
		want       []netip.AddrPort
		masquerade bool
	}{
		{"Cluster policy, a client outside", PortChoice{External: all, Cluster: all}, false, false, all, true},
		{"Cluster policy, a pod", PortChoice{External: all, Cluster: all}, true, false, all, true},
		{"Local policy, a client outside: local endpoints, its address kept", PortChoice{ExternalLocal: true, External: local, Cluster: all}, false, false, local, false},
		{"Local policy, a pod: every endpoint", PortChoice{ExternalLocal: true, External: local, Cluster: all}, true, false, all, false},
		{"Local policy, the node itself: every endpoint, masqueraded", PortChoice{ExternalLocal: true, External: nil, Cluster: all}, false, true, all, true},
		{"both policies Local, a pod: no Cluster chain, the local endpoints", PortChoice{ExternalLocal: true, External: local}, true, false, local, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, masq := c.c.ExternalFor(c.pod, c.node)
			if !slices.Equal(got, c.want) || masq != c.masquerade {
				t.Errorf("got %v masquerade %v, want %v %v", got, masq, c.want, c.masquerade)
			}
		})
	}
}
