package dns

import (
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/go-logr/logr"
)

// lameDuck is how long the server keeps answering after SIGTERM. Nodes
// send it queries until the DNS Service's EndpointSlices drop it and their
// proxies follow; during a rollout of the controller as well, that can take
// longer than a fixed lameduck (the new leader syncs first). So it answers
// for at least min, then for as long as one of its own addresses is still a
// ready endpoint of the Service, then settle more for the nodes' proxies
// to apply that, never past max.
type lameDuck struct {
	min, max, settle time.Duration
	service          svcKey
	own              []netip.Addr
	index            func() *Index
	poll             time.Duration
}

// stillServing reports whether any of own is a ready endpoint of svc in ix.
func stillServing(ix *Index, svc svcKey, own []netip.Addr) bool {
	if ix == nil || !ix.synced {
		return false
	}
	s := ix.service(svc.ns, svc.name)
	if s == nil {
		return false
	}
	for e := range s.eps.all() {
		for _, a := range own {
			if e.addr == a {
				return true
			}
		}
	}
	return false
}

// wait returns when the server may close its sockets, and how long it
// waited for its endpoint to go (zero when it was gone by min).
func (l lameDuck) wait(log logr.Logger) (extra time.Duration) {
	start := time.Now()
	time.Sleep(l.min)
	if len(l.own) == 0 || !stillServing(l.index(), l.service, l.own) {
		return 0
	}
	log.Info("lame duck: still a ready endpoint of the DNS Service, answering until it is not", "service", l.service.ns+"/"+l.service.name, "atMost", l.max)
	tick := time.NewTicker(l.poll)
	defer tick.Stop()
	for time.Since(start) < l.max {
		<-tick.C
		if !stillServing(l.index(), l.service, l.own) {
			time.Sleep(min(l.settle, max(l.max-time.Since(start), 0)))
			return time.Since(start) - l.min
		}
	}
	log.Info("lame duck: still a ready endpoint at its end; closing", "after", time.Since(start).Round(time.Millisecond))
	return time.Since(start) - l.min
}

// parseService reads "namespace/name"; zero when s is not one.
func parseService(s string) svcKey {
	ns, name, ok := strings.Cut(s, "/")
	if !ok {
		return svcKey{}
	}
	return svcKey{strings.ToLower(ns), strings.ToLower(name)}
}

// ownAddrs are the global unicast addresses of this network namespace's
// interfaces: in a pod, the pod's addresses.
func ownAddrs() []netip.Addr {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var out []netip.Addr
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().IsGlobalUnicast() {
			out = append(out, p.Addr().Unmap())
		}
	}
	return out
}
