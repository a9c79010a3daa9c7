package proxy

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/netplane/netplane/nft"
	"github.com/netplane/netplane/nodeview"
)

// This file is the fixed layout of the proxy's tables: their names, the
// base chains and their hooks, the shared sets and maps every Service adds
// its elements to, and the shared chains of pooled Services (pickCache).

// TableName is the name of netplane's table in both the ip and ip6 families.
// Nothing outside these two tables is ever touched.
const TableName = "netplane"

// tableFamily is the nftables family of the table for addresses of f:
// one table per address family, ip and ip6.
func tableFamily(f nodeview.Family) nftables.TableFamily {
	if f == nodeview.IPv6 {
		return nftables.TableFamilyIPv6
	}
	return nftables.TableFamilyIPv4
}

// tableIDs are the proxy's tables, in the order of nodeview.Families.
func tableIDs() []nft.TableID {
	out := make([]nft.TableID, len(nodeview.Families))
	for i, f := range nodeview.Families {
		out[i] = nft.TableID{Family: tableFamily(f), Name: TableName}
	}
	return out
}

// programmers program the proxy's tables in the namespace of d, with one
// monitor of the kernel's notifications for both; by address family.
func programmers(d nft.Dialer) map[nodeview.Family]nft.Syncer {
	out := map[nodeview.Family]nft.Syncer{}
	for i, p := range nft.NewProgrammers(d, tableIDs()...) {
		out[nodeview.Families[i]] = p
	}
	return out
}

// Names of the fixed chains and sets; per-Service chains are named after
// their Service (see chainBase).
//
// The programmer adds to verdict maps in the order of their names and
// removes from them in the reverse order, so firewall-ips, the
// source-range filter, sorts before service-ips: a Service's filter is in
// place before its dispatch, and outlives it.
const (
	chServices        = "services"
	chFirewallCheck   = "firewall-check"
	chEndpointsCheck  = "service-endpoints-check"
	chNodePortsCheck  = "nodeport-endpoints-check"
	chClusterIPsCheck = "cluster-ips-check"
	chReject          = "reject-chain"
	chMasquerading    = "masquerading"

	setServiceIPs    = "service-ips"
	setNodePorts     = "service-nodeports"
	setNodePortIPs   = "nodeport-ips"
	setNoEndpoints   = "no-endpoint-services"
	setNoEPNodePorts = "no-endpoint-nodeports"
	setFirewallIPs   = "firewall-ips"
	setClusterIPs    = "cluster-ips"
	setHairpin       = "hairpin"
)

// Hook priorities: the contract with other software on the node, which can
// order itself around netplane by them (see the package comment in feature.go).
const (
	PriorityFirewall   = -110 // source ranges, before DNAT
	PriorityDNAT       = -100 // Service DNAT (dstnat)
	PriorityFilter     = 0    // reject/drop of Services without endpoints
	PriorityMasquerade = 100  // SNAT (srcnat)
)

// baseRules writes the base chains, rules and sets of the table t for
// addresses of family f.
func baseRules(t *nft.Table, f nodeview.Family, n NodeFacts) {
	base := func(name string, typ nftables.ChainType, hook *nftables.ChainHook, prio int32, jumps ...string) {
		t.Chain(name, &nft.Hook{Type: typ, Hook: *hook, Priority: prio})
		for _, j := range jumps {
			if typ == nftables.ChainTypeNAT {
				t.AddRule(name, nft.NewRule(t.Family).Jump(j).Rule())
			} else {
				t.AddRule(name, nft.NewRule(t.Family).CtState(expr.CtStateBitNEW).Jump(j).Rule())
			}
		}
	}
	for _, c := range []string{chServices, chFirewallCheck, chEndpointsCheck, chNodePortsCheck, chClusterIPsCheck, chReject, chMasquerading} {
		t.Chain(c, nil)
	}
	base("filter-prerouting-pre-dnat", nftables.ChainTypeFilter, nftables.ChainHookPrerouting, PriorityFirewall, chFirewallCheck)
	base("filter-output-pre-dnat", nftables.ChainTypeFilter, nftables.ChainHookOutput, PriorityFirewall, chFirewallCheck)
	base("nat-prerouting", nftables.ChainTypeNAT, nftables.ChainHookPrerouting, PriorityDNAT, chServices)
	base("nat-output", nftables.ChainTypeNAT, nftables.ChainHookOutput, PriorityDNAT, chServices)
	base("filter-forward", nftables.ChainTypeFilter, nftables.ChainHookForward, PriorityFilter, chEndpointsCheck, chClusterIPsCheck)
	base("filter-input", nftables.ChainTypeFilter, nftables.ChainHookInput, PriorityFilter, chNodePortsCheck, chEndpointsCheck)
	base("filter-output", nftables.ChainTypeFilter, nftables.ChainHookOutput, PriorityFilter, chEndpointsCheck, chClusterIPsCheck)
	base("nat-postrouting", nftables.ChainTypeNAT, nftables.ChainHookPostrouting, PriorityMasquerade, chMasquerading)

	baseSets(t, f)
	t.AddRule(chServices, nft.NewRule(t.Family).Vmap(setServiceIPs, serviceFields...).Rule())
	t.AddRule(chServices, nft.NewRule(t.Family).Lookup(setNodePortIPs, nft.Daddr).Vmap(setNodePorts, nft.L4Proto, nft.THDport).Rule())
	t.AddRule(chFirewallCheck, nft.NewRule(t.Family).Vmap(setFirewallIPs, serviceFields...).Rule())
	t.AddRule(chEndpointsCheck, nft.NewRule(t.Family).Vmap(setNoEndpoints, serviceFields...).Rule())
	t.AddRule(chNodePortsCheck, nft.NewRule(t.Family).Lookup(setNodePortIPs, nft.Daddr).Vmap(setNoEPNodePorts, nft.L4Proto, nft.THDport).Rule())
	t.AddRule(chClusterIPsCheck, nft.NewRule(t.Family).Lookup(setClusterIPs, nft.Daddr).Reject().Rule())
	if cidrs := f.Prefixes(n.ServiceCIDRs); len(cidrs) > 0 {
		// An unallocated ClusterIP would otherwise follow the default
		// route off the node, and the client wait for a timeout there.
		t.AddRule(chClusterIPsCheck, nft.NewRule(t.Family).MatchPrefixes(nft.Daddr, cidrs, false).Drop().Rule())
	}
	t.AddRule(chReject, nft.NewRule(t.Family).Reject().Rule())
	// Into a tunnel device, SNAT to the address each of them holds: the
	// kernel ends a masqueraded connection whose output device changes
	// (nf_nat_oif_changed), and a connection moves between the VXLAN
	// device and WireGuard's as encryption is rolled in or out.
	if a, ok := nodeview.TunnelAddr(n.PodCIDRs, f); ok {
		for _, dev := range nodeview.TunnelDevices(f) {
			t.AddRule(chMasquerading, nft.NewRule(t.Family).MarkHas(masqBit).Oifname(dev).MarkClear(masqBit).SNATTo(a, true).Rule())
		}
	}
	// Clearing the mark keeps a re-used skb (VXLAN) from being masqueraded twice.
	t.AddRule(chMasquerading, nft.NewRule(t.Family).MarkHas(masqBit).MarkClear(masqBit).Masquerade(true).Rule())
	t.AddRule(chMasquerading, nft.NewRule(t.Family).Lookup(setHairpin, nft.Saddr, nft.Daddr).Masquerade(true).Rule())

	nodePortIPs := t.Sets[setNodePortIPs].Mutable()
	for _, a := range f.Of(n.NodePortIPs) {
		nodePortIPs[addrID(a)] = 1
	}
}

// clusterIPMasquerade completes r, a rule of family f's table matching
// ClusterIP traffic, with the masquerade mark: for every packet with
// --masquerade-all, else for one from outside the cluster's pod CIDRs of
// family f; false when neither applies (no pod CIDRs of f known).
func (n NodeFacts) clusterIPMasquerade(f nodeview.Family, r *nft.RuleBuilder) (nft.Rule, bool) {
	if !n.MasqueradeAll {
		cidrs := f.Prefixes(n.ClusterCIDRs)
		if len(cidrs) == 0 {
			return nft.Rule{}, false
		}
		r = r.MatchPrefixes(nft.Saddr, cidrs, true)
	}
	return r.MarkSet(masqBit).Rule(), true
}

// addrID is the id of a set's element a.
func addrID(a netip.Addr) string {
	var buf [nft.MaxIDLen]byte
	return nft.NewID(buf[:0]).Addr(a).String()
}

// baseSets declares the shared sets and maps the base rules read. The
// endpoint and pool maps are declared by their first element and dropped
// with their last (Model.reserve, Model.add, Model.remove): a cluster uses few of them,
// and creating all 288 in both families was a quarter of a full sync at
// 1,000 Services.
func baseSets(t *nft.Table, f nodeview.Family) {
	for name, spec := range sharedSets[f] {
		if !onDemand[name] {
			t.Set(name, spec)
		}
	}
}

// onDemand names the shared maps that exist only while they hold elements.
// No rule reads an empty one: a chain reading a map is some Service's, or
// a pick chain of Services with endpoints there.
var onDemand = func() map[string]bool {
	out := map[string]bool{}
	for _, name := range endpointMapNames {
		out[name] = true
	}
	return out
}()

// endpointMapNames are the maps holding endpoints: the Services' own
// shards and the pool maps.
var endpointMapNames = append(slices.Clone(endpointShardNames), poolShardNames...)

// sharedSets are the specs of the shared sets and maps, per family.
var sharedSets = map[nodeview.Family]map[string]nft.SetSpec{
	nodeview.IPv4: sharedSetSpecs(nftables.TypeIPAddr),
	nodeview.IPv6: sharedSetSpecs(nftables.TypeIP6Addr),
}

func sharedSetSpecs(addr nftables.SetDatatype) map[string]nft.SetSpec {
	vip := nftables.MustConcatSetType(addr, nftables.TypeInetProto, nftables.TypeInetService)
	pp := nftables.MustConcatSetType(nftables.TypeInetProto, nftables.TypeInetService)
	vmap := func(key nftables.SetDatatype) nft.SetSpec { return nft.SetSpec{Key: key, Data: nftables.TypeVerdict} }
	// The slot is typed "mark", 32 bits in host order: with "integer" `nft
	// list` cannot size the concatenation and aborts.
	endpoints := nft.SetSpec{
		Key:  nftables.MustConcatSetType(addr, nftables.TypeInetProto, nftables.TypeInetService, nftables.TypeMark),
		Data: nftables.MustConcatSetType(addr, nftables.TypeInetService),
	}
	specs := map[string]nft.SetSpec{}
	for _, name := range endpointMapNames {
		specs[name] = endpoints
	}
	maps.Copy(specs, map[string]nft.SetSpec{
		setServiceIPs:    vmap(vip),
		setNoEndpoints:   vmap(vip),
		setFirewallIPs:   vmap(vip),
		setNodePorts:     vmap(pp),
		setNoEPNodePorts: vmap(pp),
		setNodePortIPs:   {Key: addr},
		setClusterIPs:    {Key: addr},
		setHairpin:       {Key: nftables.MustConcatSetType(addr, addr)},
	})
	return specs
}

// pickCache builds each shared chain once for the model's node facts
// (which decide its masquerade rule); one Chain value serves every
// fragment using it, and is never changed. Fragments are built in
// parallel, hence the sync.Map.
type pickCache struct {
	masq   map[nodeview.Family]*nft.Rule // nil: no masquerade rule
	chains sync.Map                      // pickKey → *nft.Chain
}

type pickKey struct {
	fam   nodeview.Family
	proto uint8
	n     int
	set   string
}

func newPickCache(node NodeFacts) *pickCache {
	c := &pickCache{masq: map[nodeview.Family]*nft.Rule{}}
	for _, f := range nodeview.Families {
		if r, ok := node.clusterIPMasquerade(f, nft.NewRule(tableFamily(f))); ok {
			c.masq[f] = &r
		}
	}
	return c
}

// chain is "pick-tcp-3-pool-24": the ClusterIP masquerade mark, then the
// DNAT to one of n endpoints in set.
func (c *pickCache) chain(f nodeview.Family, proto uint8, n int, set string) *nft.Chain {
	key := pickKey{f, proto, n, set}
	if ch, ok := c.chains.Load(key); ok {
		return ch.(*nft.Chain)
	}
	ch := &nft.Chain{Name: fmt.Sprintf("pick-%s-%d-%s", nft.ProtoName(proto), n, set)}
	if r := c.masq[f]; r != nil {
		ch.Rules = append(ch.Rules, *r)
	}
	ch.Rules = append(ch.Rules, dnatPick(nft.NewRule(tableFamily(f)).L4Proto(proto), n, set).Rule())
	got, _ := c.chains.LoadOrStore(key, ch)
	return got.(*nft.Chain)
}
