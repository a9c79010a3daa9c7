package wireguard

import (
	"net/netip"

	"github.com/google/nftables"

	"github.com/netplane/netplane/nft"
)

// GuardTable is the nftables table that keeps pod traffic from leaving a
// node in clear while encryption is on.
var GuardTable = nft.TableID{Family: nftables.TableFamilyINet, Name: "netplane-wg"}

// The guard's chains, both on the postrouting hook: there a packet has its
// final destination (after a Service's DNAT) and its final interface
// (after the reroute that DNAT makes), whether forwarded or the node's own.
const (
	// ChainNoKey drops what is addressed to the pod CIDRs of nodes that
	// are not peers (no valid key, no address, a conflict).
	ChainNoKey = "no-key"
	// ChainClear drops what is addressed to the cluster's pod CIDRs and
	// would leave by any interface but the tunnel, the pod bridge and
	// loopback: the last line when a route is missing, as while a
	// userspace device is restarted (its routes go with its TUN device).
	ChainClear = "clear"
)

var (
	noKeyHook = &nft.Hook{Type: nftables.ChainTypeFilter, Hook: *nftables.ChainHookPostrouting, Priority: int32(*nftables.ChainPriorityFilter) - 1}
	clearHook = &nft.Hook{Type: nftables.ChainTypeFilter, Hook: *nftables.ChainHookPostrouting, Priority: int32(*nftables.ChainPriorityFilter)}
)

// Guard is the guard table: drop is the plan's Drop list, cluster the
// cluster's pod CIDRs, bridge the pod bridge's name. The rules do not
// depend on the peers, so the table changes only when a node is rejected
// or accepted.
func Guard(drop, cluster []netip.Prefix, bridge string) *nft.Table {
	t := nft.NewTable(GuardTable.Family, GuardTable.Name)
	t.Chain(ChainNoKey, noKeyHook)
	t.Chain(ChainClear, clearHook)
	for _, v6 := range []bool{false, true} {
		if ps := ofFamily(drop, v6); len(ps) > 0 {
			t.AddRule(ChainNoKey, nft.NewRule(t.Family).NFProto(v6).MatchPrefixes(nft.Daddr, ps, false).Counter().Drop().Rule())
		}
	}
	for _, name := range []string{DeviceName, bridge, "lo"} {
		t.AddRule(ChainClear, nft.NewRule(t.Family).Oifname(name).Return().Rule())
	}
	for _, v6 := range []bool{false, true} {
		if ps := ofFamily(cluster, v6); len(ps) > 0 {
			t.AddRule(ChainClear, nft.NewRule(t.Family).NFProto(v6).MatchPrefixes(nft.Daddr, ps, false).Counter().Drop().Rule())
		}
	}
	return t
}

func ofFamily(ps []netip.Prefix, v6 bool) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		if p.Addr().Is6() == v6 && !p.Addr().Is4In6() {
			out = append(out, p.Masked())
		}
	}
	return out
}
