package proxy

import (
	"crypto/sha256"
	"encoding/base32"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/netplane/netplane/nft"
	"github.com/netplane/netplane/nodeview"
)

// This file writes one Service port's share of the desired tables, one
// family at a time (builder): its dispatch elements, its own chains, and
// its endpoints in the shared maps. The model (model.go) merges the shares.

// Input is everything the desired ruleset is a function of.
type Input struct {
	Services []*serviceRecord
	// Slices by Service, as selected by the kubernetes.io/service-name label.
	Slices map[types.NamespacedName][]*sliceRecord
	Node   NodeFacts
}

// Desired is the ruleset for both families plus what the health-check
// server, the conntrack cleaner and the metrics need from the same pass.
type Desired struct {
	Tables map[nodeview.Family]*nft.Table
	// Health has one entry per Service with a healthCheckNodePort.
	Health map[types.NamespacedName]HealthInfo
	// UDP maps a UDP service address (VIP:port or node port) to the endpoint
	// addresses and target ports it may go to; a flow to anything else (a
	// gone pod, or a port the Service no longer targets) is stale.
	UDP map[netip.AddrPort]map[netip.AddrPort]bool
	// NoLocalEndpoints counts ports with Local policy and no local endpoint.
	NoLocalInternal, NoLocalExternal int
}

func newDesired() *Desired {
	return &Desired{
		Tables: map[nodeview.Family]*nft.Table{},
		Health: map[types.NamespacedName]HealthInfo{},
		UDP:    map[netip.AddrPort]map[netip.AddrPort]bool{},
	}
}

func familyEndpoints(eps []endpoint, fam nodeview.Family) []endpoint {
	return filter(eps, func(e endpoint) bool { return nodeview.FamilyOf(e.Addr) == fam })
}

// builder writes the chains and elements of one servicePort in one family.
type builder struct {
	t     *fragTable
	d     *Desired
	node  NodeFacts
	sp    *servicePort
	slot  slotKey    // the Service's part of its endpoints' keys
	picks *pickCache // the shared chains
}

// chainBase is "HASH-namespace/name/proto/port": readable, and unique by the
// hash even after truncation to the kernel's name limit.
func chainBase(s string) string {
	sum := sha256.Sum256([]byte(s))
	h := base32.StdEncoding.EncodeToString(sum[:])[:8]
	if len(s) > 200 {
		s = s[:200]
	}
	return h + "-" + s
}

func (b *builder) chainName(kind string) string { return kind + "-" + chainBase(b.sp.String()) }

func (b *builder) endpointSuffix(e endpoint) string {
	return chainBase(b.sp.String() + "__" + strings.ReplaceAll(e.addrPort().String(), ":", "."))
}

func protoNumber(p v1.Protocol) uint8 {
	switch p {
	case v1.ProtocolUDP:
		return unix.IPPROTO_UDP
	case v1.ProtocolSCTP:
		return unix.IPPROTO_SCTP
	}
	return unix.IPPROTO_TCP
}

func (b *builder) build(eps []endpoint) {
	f, sp := b.t.fam, b.sp
	cips := f.Of(sp.ClusterIPs)
	if len(cips) == 0 {
		return // a single-stack Service of the other family
	}
	b.slot = newSlotKey(cips[0], protoNumber(sp.Protocol), sp.Port)
	cat := categorize(sp, eps, b.node.Name, b.node.Zone)
	internal, external := cat.Cluster, cat.Cluster
	if sp.InternalLocal {
		internal = cat.Local
	}
	if sp.ExternalLocal {
		external = cat.Local
	}
	internalChain, externalChain := "", ""
	if b.pooled() {
		if len(internal) > 0 {
			internalChain = b.pickChain(internal)
		}
	} else {
		internalChain, externalChain = b.serviceChains(cat, cips, len(internal) > 0, len(external) > 0)
	}
	b.counts(sp, cat, f)

	proto := protoNumber(sp.Protocol)
	verdict := func(has bool) *expr.Verdict {
		if !cat.Any {
			return &expr.Verdict{Kind: expr.VerdictGoto, Chain: chReject}
		}
		if !has {
			return &expr.Verdict{Kind: expr.VerdictDrop}
		}
		return nil
	}
	// A UDP flow keeps its endpoint while that endpoint serves, as in
	// kube-proxy: a terminating DNS server answers the queries already
	// sent to it during its lameduck, although new flows go elsewhere.
	var serving []endpoint
	if sp.Protocol == v1.ProtocolUDP {
		serving = filter(eps, func(e endpoint) bool { return e.Ready || e.Serving })
	}
	for _, ip := range cips {
		b.t.addElement(setClusterIPs, addrID(ip))
		b.vip(ip, proto, internalChain, verdict(len(internal) > 0))
		b.udp(netip.AddrPortFrom(ip, sp.Port), serving)
	}
	for _, ip := range f.Of(append(append([]netip.Addr{}, sp.ExternalIPs...), sp.LoadBalancer...)) {
		b.vip(ip, proto, externalChain, verdict(len(external) > 0))
		b.udp(netip.AddrPortFrom(ip, sp.Port), serving)
	}
	if sp.NodePort != 0 {
		b.nodePort(proto, externalChain, verdict(len(external) > 0))
		for _, ip := range f.Of(b.node.NodePortIPs) {
			b.udp(netip.AddrPortFrom(ip, sp.NodePort), serving)
		}
	}
	b.firewall(proto)
}

// serviceChains writes the Service port's own chains, those of the
// cluster's and of this node's endpoints, and its external chain, and
// returns the chains its internal and external traffic go to ("" for
// none).
func (b *builder) serviceChains(cat categorized, cips []netip.Addr, hasInternal, hasExternal bool) (internalChain, externalChain string) {
	sp := b.sp
	clusterChain, localChain := b.chainName("service"), b.chainName("local")
	internalChain = clusterChain
	if sp.InternalLocal {
		internalChain = localChain
	}
	// Only the internal chain masquerades ClusterIP traffic; the other
	// one is reached by external traffic only.
	masqFor := func(chain string) []netip.Addr {
		if chain == internalChain {
			return cips
		}
		return nil
	}
	if !hasInternal {
		internalChain = ""
	}
	if sp.usesClusterEndpoints() && len(cat.Cluster) > 0 {
		b.policyChain(clusterChain, masqFor(clusterChain), cat.Cluster, 0)
	} else {
		clusterChain = ""
	}
	if sp.usesLocalEndpoints() && len(cat.Local) > 0 {
		b.policyChain(localChain, masqFor(localChain), cat.Local, localSlots)
	} else {
		localChain = ""
	}
	// With Local policy and no endpoint on this node, pods and the node
	// itself still go through the external chain to every endpoint; the
	// rest is not DNATed and meets the no-endpoint drop, as in kube-proxy.
	if sp.externallyAccessible() && (hasExternal || (sp.ExternalLocal && clusterChain != "")) {
		externalChain = b.externalChain(clusterChain, localChain)
	}
	return internalChain, externalChain
}

// vip dispatches ip.proto.port to chain (none: "") and records its
// no-endpoint verdict (none: nil), which the filter hooks apply after DNAT
// to what the chain did not DNAT.
func (b *builder) vip(ip netip.Addr, proto uint8, chain string, noEndpoints *expr.Verdict) {
	var buf [nft.MaxVerdictIDLen]byte
	if chain != "" {
		b.t.addElement(setServiceIPs, nft.NewID(buf[:0]).Addr(ip).Proto(proto).Port(b.sp.Port).EndKey().Verdict(expr.VerdictGoto, chain).String())
	}
	if noEndpoints != nil {
		b.t.addElement(setNoEndpoints, nft.NewID(buf[:0]).Addr(ip).Proto(proto).Port(b.sp.Port).EndKey().Verdict(noEndpoints.Kind, noEndpoints.Chain).String())
	}
}

// nodePort is vip for the NodePort on every node address.
func (b *builder) nodePort(proto uint8, chain string, noEndpoints *expr.Verdict) {
	var buf [nft.MaxVerdictIDLen]byte
	if chain != "" {
		b.t.addElement(setNodePorts, nft.NewID(buf[:0]).Proto(proto).Port(b.sp.NodePort).EndKey().Verdict(expr.VerdictGoto, chain).String())
	}
	if noEndpoints != nil {
		b.t.addElement(setNoEPNodePorts, nft.NewID(buf[:0]).Proto(proto).Port(b.sp.NodePort).EndKey().Verdict(noEndpoints.Kind, noEndpoints.Chain).String())
	}
}

// firewall drops sources outside loadBalancerSourceRanges before DNAT. As
// in kube-proxy, when a range holds a node address the LB IPs themselves
// are allowed too, for traffic the load balancer SNATs to its own IP.
func (b *builder) firewall(proto uint8) {
	f, sp := b.t.fam, b.sp
	lbs := f.Of(sp.LoadBalancer)
	var ranges []netip.Prefix
	for _, r := range sp.SourceRanges {
		if nodeview.FamilyOf(r.Addr()) == f {
			ranges = append(ranges, r)
		}
	}
	if len(lbs) == 0 || len(sp.SourceRanges) == 0 {
		return
	}
	for _, r := range ranges {
		if containsAny(r, b.node.NodePortIPs) {
			for _, lb := range lbs {
				ranges = append(ranges, netip.PrefixFrom(lb, lb.BitLen()))
			}
			break
		}
	}
	name := b.chainName("firewall")
	b.t.Chain(name, nil)
	r := nft.NewRule(tableFamily(f))
	if len(ranges) > 0 {
		r.InPrefixes(nft.Saddr, ranges, true)
	}
	b.t.AddRule(name, r.Drop().Rule())
	for _, lb := range lbs {
		var buf [nft.MaxVerdictIDLen]byte
		b.t.addElement(setFirewallIPs, nft.NewID(buf[:0]).Addr(lb).Proto(proto).Port(sp.Port).EndKey().Verdict(expr.VerdictGoto, name).String())
	}
}

func containsAny(p netip.Prefix, as []netip.Addr) bool {
	for _, a := range as {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

func (b *builder) udp(vip netip.AddrPort, eps []endpoint) {
	if b.sp.Protocol != v1.ProtocolUDP {
		return
	}
	m := b.d.UDP[vip]
	if m == nil {
		m = map[netip.AddrPort]bool{}
		b.d.UDP[vip] = m
	}
	for _, e := range eps {
		m[netip.AddrPortFrom(e.Addr, e.Port)] = true
	}
}

func (b *builder) counts(sp *servicePort, cat categorized, f nodeview.Family) {
	if f != nodeview.IPv4 && len(nodeview.IPv4.Of(sp.ClusterIPs)) > 0 {
		return // count each Service once, in its first family
	}
	if cat.Any && len(cat.Local) == 0 {
		if sp.InternalLocal {
			b.d.NoLocalInternal++
		}
		if sp.ExternalLocal {
			b.d.NoLocalExternal++
		}
	}
	if sp.HealthCheckNodePort != 0 {
		local := 0
		for _, e := range cat.Local {
			if e.Ready { // terminating endpoints count as none: the LB should move away
				local++
			}
		}
		h := b.d.Health[sp.Service]
		h.Port, h.Addrs = sp.HealthCheckNodePort, b.node.HealthCheckIPs
		h.LocalEndpoints = max(h.LocalEndpoints, local)
		b.d.Health[sp.Service] = h
	}
}

// pooled: a Service reached only through its ClusterIPs and without
// affinity, the most common kind, needs no chain of its own (pickChain).
// At 1,000 such Services that spares the kernel 1,000 chains and 2,000
// rules, half the work of a full sync.
func (b *builder) pooled() bool { return !b.sp.externallyAccessible() && b.sp.Affinity == 0 }

// pickChain adds the endpoints of a pooled Service to its pool map (by
// their count, see poolShard), under its ClusterIP, protocol and port, and
// returns the chain that picks one by the packet's own address, protocol
// and port, shared by every pooled Service with the same protocol, count
// and pool map. Only the endpoints the ClusterIP leads to are there (all,
// or the local ones with internalTrafficPolicy Local), so their slots
// start at 0.
func (b *builder) pickChain(eps []endpoint) string {
	sp, t := b.sp, b.t
	set := poolShard(sp, len(eps))
	for i, e := range eps {
		// Traffic to a ClusterIP is translated on its sender's node, so a
		// pod can only reach itself through this node's rules if it runs
		// here. Leaving the others out halves a big sync's elements when
		// most endpoints are elsewhere. (Externally reachable Services keep
		// all: a pod may come back to itself through another node's
		// NodePort.)
		if !e.Remote {
			t.addElement(setHairpin, hairpinID(e.Addr))
		}
		t.addElement(set, b.slot.elemID(uint32(i), e.addrPort()))
	}
	c := b.picks.chain(t.fam, protoNumber(sp.Protocol), len(eps), set)
	t.useShared(c)
	return c.Name
}

// policyChain writes a service-/local- chain: the ClusterIP masquerade
// mark, then the choice of endpoint and its DNAT; its endpoints' slots
// start at offset (see endpointShards).
func (b *builder) policyChain(name string, cips []netip.Addr, eps []endpoint, offset uint32) {
	f, sp, t := b.t.fam, b.sp, b.t
	t.Chain(name, nil)
	for _, cip := range cips {
		to := nft.NewRule(tableFamily(f)).MatchPrefix(nft.Daddr, netip.PrefixFrom(cip, cip.BitLen()), false)
		if r, ok := b.node.clusterIPMasquerade(f, to); ok {
			t.AddRule(name, r)
		}
	}
	proto := protoNumber(sp.Protocol)
	for _, e := range eps {
		t.addElement(setHairpin, hairpinID(e.Addr))
	}
	if sp.Affinity > 0 {
		b.affinity(name, proto, eps)
		return
	}
	if len(eps) == 1 {
		t.AddRule(name, nft.NewRule(tableFamily(f)).L4Proto(proto).DNATTo(eps[0].addrPort()).Rule())
		return
	}
	set := endpointShard(sp)
	for i, e := range eps {
		t.addElement(set, b.slot.elemID(offset+uint32(i), e.addrPort()))
	}
	t.AddRule(name, dnatSlot(nft.NewRule(tableFamily(f)).L4Proto(proto), b.slot, len(eps), offset, set).Rule())
}

// maxPickRules is the most endpoint chains an affinity Service chooses
// among with a sequence of rules, each taking its chain with probability
// 1/(chains left) (equal weights, as iptables' statistic chains); beyond
// it, one rule with an anonymous map.
const maxPickRules = 16

// affinity sends a client that chose an endpoint in the last timeout back to
// it: one dynamic set of client addresses and one chain per endpoint.
func (b *builder) affinity(name string, proto uint8, eps []endpoint) {
	f, sp, t := b.t.fam, b.sp, b.t
	addr := nftables.TypeIPAddr
	if f == nodeview.IPv6 {
		addr = nftables.TypeIP6Addr
	}
	chains := make([]string, len(eps))
	for i, e := range eps {
		suffix := b.endpointSuffix(e)
		set, chain := "affinity-"+suffix, "endpoint-"+suffix
		chains[i] = chain
		t.Set(set, nft.SetSpec{Key: addr, Dynamic: true, Timeout: sp.Affinity})
		t.Chain(chain, nil)
		t.AddRule(chain, nft.NewRule(tableFamily(f)).Update(set, nft.Saddr, sp.Affinity).Rule())
		t.AddRule(chain, nft.NewRule(tableFamily(f)).L4Proto(proto).DNATTo(e.addrPort()).Rule())
		t.AddRule(name, nft.NewRule(tableFamily(f)).Lookup(set, nft.Saddr).Goto(chain).Rule())
	}
	if len(chains) > maxPickRules {
		t.AddRule(name, nft.NewRule(tableFamily(f)).NumgenVmap(chains).Rule())
		return
	}
	for i, c := range chains {
		r := nft.NewRule(tableFamily(f))
		if left := len(chains) - i; left > 1 {
			r.PickOneOf(left)
		}
		t.AddRule(name, r.Goto(c).Rule())
	}
}

// externalChain writes the external- chain NodePorts, externalIPs and LB
// IPs lead to, and returns its name.
func (b *builder) externalChain(clusterChain, localChain string) string {
	f, t := b.t.fam, b.t
	name := b.chainName("external")
	t.Chain(name, nil)
	if !b.sp.ExternalLocal {
		// The reply must come back through this node to be un-DNATed.
		t.AddRule(name, nft.NewRule(tableFamily(f)).MarkSet(masqBit).Rule())
		t.AddRule(name, nft.NewRule(tableFamily(f)).Goto(clusterChain).Rule())
		return name
	}
	// Local policy keeps the client's address and uses only local endpoints,
	// but pods and the node itself reach every endpoint, as if they had
	// hairpinned through the load balancer. Without local endpoints the
	// other sources fall through, undone, to the no-endpoint drop.
	short := clusterChain
	if short == "" {
		short = localChain
	}
	if cidrs := f.Prefixes(b.node.ClusterCIDRs); len(cidrs) > 0 {
		t.AddRule(name, nft.NewRule(tableFamily(f)).MatchPrefixes(nft.Saddr, cidrs, false).Goto(short).Rule())
	}
	t.AddRule(name, nft.NewRule(tableFamily(f)).FibLocal(nft.Saddr).MarkSet(masqBit).Rule())
	t.AddRule(name, nft.NewRule(tableFamily(f)).FibLocal(nft.Saddr).Goto(short).Rule())
	if localChain != "" {
		t.AddRule(name, nft.NewRule(tableFamily(f)).Goto(localChain).Rule())
	}
	return name
}

// fragTable is one family's share of one Service as it is built: the
// Service's own chains and sets in a Table, and in slices the shared chains
// it uses (pickChain) and the elements it adds to shared sets, which the
// model merges into its own sets: at start-up a map per set and Service
// was a fifth of a build's allocations.
type fragTable struct {
	*nft.Table
	fam    nodeview.Family // of the addresses; Table.Family is nftables'
	shared []*nft.Chain
	elems  []fragElem
}

// fragElem is an element the Service adds to a shared set.
type fragElem struct{ set, id string }

func newFragTable(fam nodeview.Family) *fragTable {
	return &fragTable{Table: nft.NewTable(tableFamily(fam), TableName), fam: fam}
}

// addElement adds an element to a shared set.
func (t *fragTable) addElement(set, id string) { t.elems = append(t.elems, fragElem{set, id}) }

// useShared notes a shared chain the Service uses, built once for all.
func (t *fragTable) useShared(c *nft.Chain) {
	if !slices.Contains(t.shared, c) {
		t.shared = append(t.shared, c)
	}
}
