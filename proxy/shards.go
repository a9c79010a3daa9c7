package proxy

import (
	"fmt"
	"hash/fnv"
)

// This file names the shared maps endpoints live in, instead of a map per
// Service: the endpoint shards, and the pool maps of the Services reached
// by ClusterIP only (builder.pickChain).

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
