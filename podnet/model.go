package podnet

import (
	"encoding/json"
	"net/netip"
	"slices"

	"github.com/google/nftables"

	"github.com/netplane/netplane/cni/conflist"
	"github.com/netplane/netplane/nft"
)

// ConflistName sorts first in the CNI configuration directory, so runtimes
// that use the lexicographically first file pick netplane.
const ConflistName = "00-netplane.conflist"

// MasqTable is the table of pod egress: separate from the proxy's
// `netplane` tables and the plugin's hostPort table, so each owner
// rewrites only its own.
var MasqTable = nft.TableID{Family: nftables.TableFamilyINet, Name: "netplane-pods"}

// masqPlan says which pod traffic leaving the node keeps its source: pods
// of this node (sources) reaching the cluster's pod network (exempt: the
// cluster's pod CIDRs, nodeview.Settings.ClusterCIDRs) are not
// masqueraded.
type masqPlan struct {
	Sources []netip.Prefix
	Exempt  []netip.Prefix
}

var (
	srcNAT        = &nft.Hook{Type: nftables.ChainTypeNAT, Hook: *nftables.ChainHookPostrouting, Priority: int32(*nftables.ChainPriorityNATSource)}
	filterForward = &nft.Hook{Type: nftables.ChainTypeFilter, Hook: *nftables.ChainHookForward, Priority: int32(*nftables.ChainPriorityFilter)}
)

// masqueradeTable is the table of p:
//
//	postrouting (srcnat): from a pod of this node to an exempt CIDR: return;
//	                      from a pod of this node elsewhere: masquerade
//	forward (filter): pod traffic either way is accepted
func masqueradeTable(p masqPlan) *nft.Table {
	t := nft.NewTable(MasqTable.Family, MasqTable.Name)
	t.Chain("postrouting", srcNAT)
	t.Chain("forward", filterForward)
	rule := func(v6 bool) *nft.RuleBuilder { return nft.NewRule(t.Family).NFProto(v6) }
	for _, src := range p.Sources {
		v6 := src.Addr().Is6()
		var exempt []netip.Prefix
		for _, ex := range p.Exempt {
			if ex.Addr().Is6() == v6 {
				exempt = append(exempt, ex)
			}
		}
		if len(exempt) > 0 {
			t.AddRule("postrouting", rule(v6).MatchPrefix(nft.Saddr, src, false).MatchPrefixes(nft.Daddr, exempt, false).Return().Rule())
		}
		t.AddRule("postrouting", rule(v6).MatchPrefix(nft.Saddr, src, false).Masquerade(false).Rule())
	}
	for _, pfx := range append(slices.Clone(p.Sources), p.Exempt...) {
		t.AddRule("forward", rule(pfx.Addr().Is6()).MatchPrefix(nft.Saddr, pfx, false).Accept().Rule())
		t.AddRule("forward", rule(pfx.Addr().Is6()).MatchPrefix(nft.Daddr, pfx, false).Accept().Rule())
	}
	return t
}

// conflistOpts is what the conflist says.
type conflistOpts struct {
	PodCIDRs []netip.Prefix
	Bridge   string
	MTU      int
	StateDir string
}

// renderConflist is the conflist for this node. It names 1.0.0 for old
// runtimes and lists 1.1.0 so that newer ones send STATUS and GC.
func renderConflist(o conflistOpts) []byte {
	cidrs := make([]string, 0, len(o.PodCIDRs))
	for _, p := range o.PodCIDRs {
		cidrs = append(cidrs, p.String())
	}
	l := conflist.List{
		CNIVersion:  "1.0.0",
		CNIVersions: []string{"1.0.0", "1.1.0"},
		Name:        "netplane",
		Plugins: []conflist.Plugin{{
			Type:         conflist.Type,
			Bridge:       o.Bridge,
			MTU:          o.MTU,
			PodCIDRs:     cidrs,
			StateDir:     o.StateDir,
			Capabilities: map[string]bool{"portMappings": true},
		}},
	}
	b, _ := json.MarshalIndent(l, "", "  ")
	return append(b, '\n')
}
