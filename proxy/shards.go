package proxy

import (
	"fmt"
	"hash/fnv"
	"sync"

	"github.com/netplane/netplane/nft"
	"github.com/netplane/netplane/nodeview"
)

// This file is where endpoints live: shared maps instead of a map per
// Service, and shared chains for the Services reached by ClusterIP only.

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
			t.addElement(setHairpin, hairpinID(e.Addr))
		}
		t.addElement(set, b.slot.elemID(uint32(i), e.addrPort()))
	}
	c := b.picks.chain(t.fam, protoNumber(sp.Protocol), len(eps), set)
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
// another map and its dispatch element to another chain; the programmer
// adds the new elements before it switches the dispatch, and removes the
// old ones after (nft's plan.diff).
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
