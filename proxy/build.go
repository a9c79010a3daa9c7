package proxy

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"hash/fnv"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// NodeFacts are the facts about this node the rules depend on.
type NodeFacts struct {
	Name string
	Zone string // topology.kubernetes.io/zone of the Node
	// ClusterCIDRs: traffic to a ClusterIP from outside all of them is
	// masqueraded. Any number per family.
	ClusterCIDRs []netip.Prefix
	// ServiceCIDRs: new traffic to an address in them that is no ClusterIP
	// is dropped rather than routed off the node. At most one per family.
	ServiceCIDRs []netip.Prefix
	// NodePortIPs are the addresses NodePorts are served on.
	NodePortIPs []netip.Addr
	// HealthCheckIPs are the addresses the health-check node ports listen
	// on: NodePortIPs, or an unspecified address (0.0.0.0, ::) for every
	// address of its family when --nodeport-addresses matches them all.
	HealthCheckIPs []netip.Addr
	MasqueradeAll  bool
}

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
	Tables map[nftables.TableFamily]*Table
	// Health has one entry per Service with a healthCheckNodePort.
	Health map[types.NamespacedName]HealthInfo
	// UDP maps a UDP service address (VIP:port or node port) to the endpoint
	// addresses it may go to; a flow to anything else is stale.
	UDP map[netip.AddrPort]map[netip.Addr]bool
	// NoLocalEndpoints counts ports with Local policy and no local endpoint.
	NoLocalInternal, NoLocalExternal int
}

// HealthInfo is what the health-check node port of one Service reports,
// and where it listens.
type HealthInfo struct {
	Port           uint16
	LocalEndpoints int
	Addrs          []netip.Addr // see NodeFacts.HealthCheckIPs
}

// Families are the two tables netplane programs.
var Families = []nftables.TableFamily{nftables.TableFamilyIPv4, nftables.TableFamilyIPv6}

// Names of the fixed chains and sets; per-Service chains are named after
// their Service (see chainBase).
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

// Build computes the desired ruleset. It is a pure function of in.
func Build(in Input) *Desired { return NewModel().Build(in) }

func newDesired() *Desired {
	return &Desired{
		Tables: map[nftables.TableFamily]*Table{},
		Health: map[types.NamespacedName]HealthInfo{},
		UDP:    map[netip.AddrPort]map[netip.Addr]bool{},
	}
}

func isFamily(a netip.Addr, fam nftables.TableFamily) bool {
	return a.Is4() == (fam == nftables.TableFamilyIPv4)
}

func familyAddrs(as []netip.Addr, fam nftables.TableFamily) []netip.Addr {
	var out []netip.Addr
	for _, a := range as {
		if isFamily(a, fam) {
			out = append(out, a)
		}
	}
	return out
}

func familyPrefixes(ps []netip.Prefix, fam nftables.TableFamily) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		if isFamily(p.Addr(), fam) {
			out = append(out, p.Masked())
		}
	}
	return out
}

func familyEndpoints(eps []endpoint, fam nftables.TableFamily) []endpoint {
	return filter(eps, func(e endpoint) bool { return isFamily(e.Addr, fam) })
}

// Hook priorities: the contract with other software on the node, which can
// order itself around netplane by them (see doc.go).
const (
	PriorityFirewall   = -110 // source ranges, before DNAT
	PriorityDNAT       = -100 // Service DNAT (dstnat)
	PriorityFilter     = 0    // reject/drop of Services without endpoints
	PriorityMasquerade = 100  // SNAT (srcnat)
)

func baseRules(t *Table, n NodeFacts) {
	f := t.Family
	base := func(name string, typ nftables.ChainType, hook *nftables.ChainHook, prio int32, jumps ...string) {
		t.chain(name, &Hook{Type: typ, Hook: *hook, Priority: prio})
		for _, j := range jumps {
			if typ == nftables.ChainTypeNAT {
				t.addRule(name, newRule(f).jump(j).done())
			} else {
				t.addRule(name, newRule(f).ctStateNew().jump(j).done())
			}
		}
	}
	for _, c := range []string{chServices, chFirewallCheck, chEndpointsCheck, chNodePortsCheck, chClusterIPsCheck, chReject, chMasquerading} {
		t.chain(c, nil)
	}
	base("filter-prerouting-pre-dnat", nftables.ChainTypeFilter, nftables.ChainHookPrerouting, PriorityFirewall, chFirewallCheck)
	base("filter-output-pre-dnat", nftables.ChainTypeFilter, nftables.ChainHookOutput, PriorityFirewall, chFirewallCheck)
	base("nat-prerouting", nftables.ChainTypeNAT, nftables.ChainHookPrerouting, PriorityDNAT, chServices)
	base("nat-output", nftables.ChainTypeNAT, nftables.ChainHookOutput, PriorityDNAT, chServices)
	base("filter-forward", nftables.ChainTypeFilter, nftables.ChainHookForward, PriorityFilter, chEndpointsCheck, chClusterIPsCheck)
	base("filter-input", nftables.ChainTypeFilter, nftables.ChainHookInput, PriorityFilter, chNodePortsCheck, chEndpointsCheck)
	base("filter-output", nftables.ChainTypeFilter, nftables.ChainHookOutput, PriorityFilter, chEndpointsCheck, chClusterIPsCheck)
	base("nat-postrouting", nftables.ChainTypeNAT, nftables.ChainHookPostrouting, PriorityMasquerade, chMasquerading)

	baseSets(t)
	t.addRule(chServices, newRule(f).vmapAddrProtoPort(setServiceIPs).done())
	t.addRule(chServices, newRule(f).lookupAddr("daddr", setNodePortIPs).vmapProtoPort(setNodePorts).done())
	t.addRule(chFirewallCheck, newRule(f).vmapAddrProtoPort(setFirewallIPs).done())
	t.addRule(chEndpointsCheck, newRule(f).vmapAddrProtoPort(setNoEndpoints).done())
	t.addRule(chNodePortsCheck, newRule(f).lookupAddr("daddr", setNodePortIPs).vmapProtoPort(setNoEPNodePorts).done())
	t.addRule(chClusterIPsCheck, newRule(f).lookupAddr("daddr", setClusterIPs).reject().done())
	if cidrs := familyPrefixes(n.ServiceCIDRs, f); len(cidrs) > 0 {
		// An unallocated ClusterIP would otherwise follow the default
		// route off the node, and the client wait for a timeout there.
		t.addRule(chClusterIPsCheck, newRule(f).matchPrefixes("daddr", cidrs, false).drop().done())
	}
	t.addRule(chReject, newRule(f).reject().done())
	t.addRule(chMasquerading, newRule(f).masqMarked().masquerade().done())
	t.addRule(chMasquerading, newRule(f).lookupSaddrDaddr(setHairpin).masquerade().done())

	for _, a := range familyAddrs(n.NodePortIPs, f) {
		t.addElement(setNodePortIPs, Element{Key: a.AsSlice()})
	}
}

// baseSets declares the shared sets and maps the base rules read. The
// endpoint and pool maps are declared by their first element and dropped
// with their last (Model.reserve, Model.add, Model.remove): a cluster uses few of them,
// and creating all 288 in both families was a quarter of a full sync at
// 1,000 Services.
func baseSets(t *Table) {
	for name, spec := range sharedSets[t.Family] {
		if !onDemand[name] {
			t.set(name, spec)
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
var sharedSets = map[nftables.TableFamily]map[string]SetSpec{
	nftables.TableFamilyIPv4: sharedSetSpecs(nftables.TypeIPAddr),
	nftables.TableFamilyIPv6: sharedSetSpecs(nftables.TypeIP6Addr),
}

func sharedSetSpecs(addr nftables.SetDatatype) map[string]SetSpec {
	vip := nftables.MustConcatSetType(addr, nftables.TypeInetProto, nftables.TypeInetService)
	pp := nftables.MustConcatSetType(nftables.TypeInetProto, nftables.TypeInetService)
	vmap := func(key nftables.SetDatatype) SetSpec { return SetSpec{Key: key, Data: nftables.TypeVerdict} }
	// The slot is typed "mark", 32 bits in host order: with "integer" `nft
	// list` cannot size the concatenation and aborts.
	endpoints := SetSpec{
		Key:  nftables.MustConcatSetType(addr, nftables.TypeInetProto, nftables.TypeInetService, nftables.TypeMark),
		Data: nftables.MustConcatSetType(addr, nftables.TypeInetService),
	}
	specs := map[string]SetSpec{}
	for _, name := range endpointMapNames {
		specs[name] = endpoints
	}
	maps.Copy(specs, map[string]SetSpec{
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

// builder writes the chains and elements of one servicePort in one family.
type builder struct {
	t     *Table
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
	f, sp := b.t.Family, b.sp
	cips := familyAddrs(sp.ClusterIPs, f)
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
		if sp.usesClusterEndpoints() && len(cat.Cluster) > 0 {
			b.policyChain(clusterChain, masqFor(clusterChain), cat.Cluster, 0)
		}
		if sp.usesLocalEndpoints() && len(cat.Local) > 0 {
			b.policyChain(localChain, masqFor(localChain), cat.Local, localSlots)
		}
		if sp.externallyAccessible() && len(external) > 0 {
			externalChain = b.externalChain(clusterChain, localChain, cat)
		}
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
	for _, ip := range cips {
		b.t.addElement(setClusterIPs, Element{Key: ip.AsSlice()})
		b.vip(ip, proto, internalChain, verdict(len(internal) > 0))
		b.udp(netip.AddrPortFrom(ip, sp.Port), internal)
	}
	for _, ip := range familyAddrs(append(append([]netip.Addr{}, sp.ExternalIPs...), sp.LoadBalancer...), f) {
		b.vip(ip, proto, externalChain, verdict(len(external) > 0))
		b.udp(netip.AddrPortFrom(ip, sp.Port), cat.Cluster)
	}
	if sp.NodePort != 0 {
		b.nodePort(proto, externalChain, verdict(len(external) > 0))
		for _, ip := range familyAddrs(b.node.NodePortIPs, f) {
			b.udp(netip.AddrPortFrom(ip, sp.NodePort), cat.Cluster)
		}
	}
	b.firewall(proto)
}

// vip dispatches ip.proto.port to chain, or records its no-endpoint verdict.
func (b *builder) vip(ip netip.Addr, proto uint8, chain string, noEndpoints *expr.Verdict) {
	key := concat(ip.AsSlice(), protoKey(proto), port(b.sp.Port))
	if noEndpoints != nil {
		b.t.addElement(setNoEndpoints, Element{Key: key, Verdict: noEndpoints})
		return
	}
	b.t.addElement(setServiceIPs, Element{Key: key, Verdict: &expr.Verdict{Kind: expr.VerdictGoto, Chain: chain}})
}

func (b *builder) nodePort(proto uint8, chain string, noEndpoints *expr.Verdict) {
	key := concat(protoKey(proto), port(b.sp.NodePort))
	if noEndpoints != nil {
		b.t.addElement(setNoEPNodePorts, Element{Key: key, Verdict: noEndpoints})
		return
	}
	b.t.addElement(setNodePorts, Element{Key: key, Verdict: &expr.Verdict{Kind: expr.VerdictGoto, Chain: chain}})
}

func verdictText(v *expr.Verdict) string {
	if v.Kind == expr.VerdictDrop {
		return "drop"
	}
	return "goto " + v.Chain
}

// firewall drops sources outside loadBalancerSourceRanges before DNAT. As
// in kube-proxy, when a range holds a node address the LB IPs themselves
// are allowed too, for traffic the load balancer SNATs to its own IP.
func (b *builder) firewall(proto uint8) {
	f, sp := b.t.Family, b.sp
	lbs := familyAddrs(sp.LoadBalancer, f)
	var ranges []netip.Prefix
	for _, r := range sp.SourceRanges {
		if r.Addr().Is4() == (f == nftables.TableFamilyIPv4) {
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
	b.t.chain(name, nil)
	r := newRule(f)
	if len(ranges) > 0 {
		r.notInAnon("saddr", ranges)
	}
	b.t.addRule(name, r.drop().done())
	v := &expr.Verdict{Kind: expr.VerdictGoto, Chain: name}
	for _, lb := range lbs {
		b.t.addElement(setFirewallIPs, Element{Key: concat(lb.AsSlice(), protoKey(proto), port(sp.Port)), Verdict: v})
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
		m = map[netip.Addr]bool{}
		b.d.UDP[vip] = m
	}
	for _, e := range eps {
		m[e.Addr] = true
	}
}

func (b *builder) counts(sp *servicePort, cat categorized, f nftables.TableFamily) {
	if f != nftables.TableFamilyIPv4 && len(familyAddrs(sp.ClusterIPs, nftables.TableFamilyIPv4)) > 0 {
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

// policyChain writes a service-/local- chain: the ClusterIP masquerade
// mark, then the choice of endpoint and its DNAT; its endpoints' slots
// start at offset (see endpointShards).
func (b *builder) policyChain(name string, cips []netip.Addr, eps []endpoint, offset uint32) {
	f, sp, t := b.t.Family, b.sp, b.t
	t.chain(name, nil)
	for _, cip := range cips {
		if b.node.MasqueradeAll {
			t.addRule(name, newRule(f).matchPrefix("daddr", netip.PrefixFrom(cip, cip.BitLen()), false).setMasqMark().done())
		} else if cidrs := familyPrefixes(b.node.ClusterCIDRs, f); len(cidrs) > 0 {
			t.addRule(name, newRule(f).matchPrefix("daddr", netip.PrefixFrom(cip, cip.BitLen()), false).
				matchPrefixes("saddr", cidrs, true).setMasqMark().done())
		}
	}
	proto := protoNumber(sp.Protocol)
	for _, e := range eps {
		t.addElementID(setHairpin, hairpinID(e.Addr))
	}
	if sp.Affinity > 0 {
		b.affinity(name, proto, eps)
		return
	}
	if len(eps) == 1 {
		t.addRule(name, newRule(f).l4proto(proto).dnatTo(eps[0].addrPort()).done())
		return
	}
	set := endpointShard(sp)
	for i, e := range eps {
		t.addElementID(set, b.slot.elemID(offset+uint32(i), e.addrPort()))
	}
	t.addRule(name, newRule(f).l4proto(proto).dnatSlot(b.slot, len(eps), offset, set).done())
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
// and pool map. Only the endpoints
// the ClusterIP leads to are there (all, or the local ones with
// internalTrafficPolicy Local), so their slots start at 0.
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
			t.addElementID(setHairpin, hairpinID(e.Addr))
		}
		t.addElementID(set, b.slot.elemID(uint32(i), e.addrPort()))
	}
	c := b.picks.chain(t.Family, protoNumber(sp.Protocol), len(eps), set)
	t.useShared(c)
	return c.Name
}

// Pool maps hold the endpoints of pooled Services, chosen by their count
// and spread by a hash of the Service over poolSpread maps per count:
//   - the kernel checks every element added to a map against every rule
//     reading it, so a map should be read by few counts' chains;
//   - it dumps a set by walking past every element already sent, for each
//     32 KiB of answer, so a map should not hold all of 10,000 Services
//     with the same count (reading it back at a restart then took 0.4 s);
//   - each map a count spreads over is one more chain for that count.
//
// A Service whose endpoint count changes usually moves its elements to
// another map and its dispatch element to another chain; the renderer
// adds the new elements before it switches the dispatch, and removes the
// old ones after (plan.diff).
const (
	poolShards = 32
	poolSpread = 8
)

var poolShardNames = func() []string {
	out := make([]string, poolShards)
	for i := range out {
		out[i] = fmt.Sprintf("pool-%02d", i)
	}
	return out
}()

func poolShard(sp *servicePort, n int) string {
	return poolShardNames[(n*poolSpread+int(portHash(sp)%poolSpread))%poolShards]
}

// portHash spreads Services over maps, the same for the same Service port.
func portHash(sp *servicePort) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(sp.String()))
	return h.Sum32()
}

// pickCache builds each shared chain once for the model's node facts
// (which decide its masquerade rule); one Chain value serves every
// fragment using it. Fragments are built in parallel, hence the sync.Map.
type pickCache struct {
	masq   map[nftables.TableFamily]*Rule // nil: no masquerade rule
	chains sync.Map                       // pickKey → *Chain
}

type pickKey struct {
	fam   nftables.TableFamily
	proto uint8
	n     int
	set   string
}

func newPickCache(node NodeFacts) *pickCache {
	c := &pickCache{masq: map[nftables.TableFamily]*Rule{}}
	for _, f := range Families {
		var r Rule
		if node.MasqueradeAll {
			r = newRule(f).setMasqMark().done()
		} else if cidrs := familyPrefixes(node.ClusterCIDRs, f); len(cidrs) > 0 {
			r = newRule(f).matchPrefixes("saddr", cidrs, true).setMasqMark().done()
		} else {
			continue
		}
		c.masq[f] = &r
	}
	return c
}

// chain is "pick-tcp-3-pool-24": the ClusterIP masquerade mark, then the
// DNAT to one of n endpoints in set.
func (c *pickCache) chain(f nftables.TableFamily, proto uint8, n int, set string) *Chain {
	key := pickKey{f, proto, n, set}
	if ch, ok := c.chains.Load(key); ok {
		return ch.(*Chain)
	}
	ch := &Chain{Name: fmt.Sprintf("pick-%s-%d-%s", protoName(proto), n, set), Shared: true}
	if r := c.masq[f]; r != nil {
		ch.Rules = append(ch.Rules, *r)
	}
	ch.Rules = append(ch.Rules, newRule(f).l4proto(proto).dnatPick(n, set).done())
	got, _ := c.chains.LoadOrStore(key, ch)
	return got.(*Chain)
}

// Endpoints are elements of shared maps, keyed by the Service's ClusterIP,
// protocol and port and a slot that numgen picks (the local chain's slots
// start at localSlots). A map per Service, as kube-proxy has, costs the
// kernel a walk of the table's list of sets by name whenever a set is made
// or used, O(N²) for N Services. One shared map costs a check of each
// element added against every rule that reads the map, and a walk of the
// map's elements for every rule bound to it: O(N²) again. Spread over
// endpointShards maps by a hash of the Service, both stay small. An
// endpoint change is then a change of map elements only, which spares the
// kernel the validation of the whole table that any new rule costs
// (30 ms per base chain at 10,000 Services).
const (
	endpointShards = 256
	localSlots     = 1 << 31
)

var endpointShardNames = func() []string {
	out := make([]string, endpointShards)
	for i := range out {
		out[i] = fmt.Sprintf("endpoints-%03d", i)
	}
	return out
}()

// endpointShard is the map holding sp's endpoints.
func endpointShard(sp *servicePort) string {
	return endpointShardNames[portHash(sp)%endpointShards]
}

// maxPickRules is the most endpoint chains an affinity Service chooses
// among with a sequence of rules, each taking its chain with probability
// 1/(chains left) (equal weights, as iptables' statistic chains); beyond
// it, one rule with an anonymous map.
const maxPickRules = 16

// affinity sends a client that chose an endpoint in the last timeout back to
// it: one dynamic set of client addresses and one chain per endpoint.
func (b *builder) affinity(name string, proto uint8, eps []endpoint) {
	f, sp, t := b.t.Family, b.sp, b.t
	addr := nftables.TypeIPAddr
	if f == nftables.TableFamilyIPv6 {
		addr = nftables.TypeIP6Addr
	}
	chains := make([]string, len(eps))
	for i, e := range eps {
		suffix := b.endpointSuffix(e)
		set, chain := "affinity-"+suffix, "endpoint-"+suffix
		chains[i] = chain
		t.set(set, SetSpec{Key: addr, Dynamic: true, Timeout: sp.Affinity})
		t.chain(chain, nil)
		t.addRule(chain, newRule(f).updateSaddr(set, sp.Affinity).done())
		t.addRule(chain, newRule(f).l4proto(proto).dnatTo(e.addrPort()).done())
		t.addRule(name, newRule(f).lookupAddr("saddr", set).goTo(chain).done())
	}
	if len(chains) > maxPickRules {
		t.addRule(name, newRule(f).numgenVmap(chains).done())
		return
	}
	for i, c := range chains {
		r := newRule(f)
		if left := len(chains) - i; left > 1 {
			r.pickOneOf(left)
		}
		t.addRule(name, r.goTo(c).done())
	}
}

// externalChain writes the external- chain NodePorts, externalIPs and LB
// IPs lead to, and returns its name.
func (b *builder) externalChain(clusterChain, localChain string, cat categorized) string {
	f, t := b.t.Family, b.t
	name := b.chainName("external")
	t.chain(name, nil)
	if !b.sp.ExternalLocal {
		// The reply must come back through this node to be un-DNATed.
		t.addRule(name, newRule(f).setMasqMark().done())
		t.addRule(name, newRule(f).goTo(clusterChain).done())
		return name
	}
	// Local policy keeps the client's address and uses only local endpoints,
	// but pods and the node itself reach every endpoint, as if they had
	// hairpinned through the load balancer.
	short := clusterChain
	if !b.sp.usesClusterEndpoints() || len(cat.Cluster) == 0 {
		short = localChain
	}
	if cidrs := familyPrefixes(b.node.ClusterCIDRs, f); len(cidrs) > 0 {
		t.addRule(name, newRule(f).matchPrefixes("saddr", cidrs, false).goTo(short).done())
	}
	t.addRule(name, newRule(f).fibSaddrLocal().setMasqMark().done())
	t.addRule(name, newRule(f).fibSaddrLocal().goTo(short).done())
	t.addRule(name, newRule(f).goTo(localChain).done())
	return name
}
