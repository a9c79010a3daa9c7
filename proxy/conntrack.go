package proxy

import (
	"maps"
	"net/netip"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// UDP has no connection to end: a conntrack entry keeps sending a client's
// datagrams to the endpoint it first chose, even after that endpoint is gone
// (DNS through a Service breaks when its pods move). After the rules change,
// entries for a Service address whose reply comes from an address that is no
// longer one of its serving endpoints are deleted; so are those answered from
// an endpoint's port the Service no longer targets (its targetPort changed,
// and a client sending from one source port would never leave the old one).
// An endpoint that terminates but still serves keeps its entries, as in
// kube-proxy: deleting them would lose the replies it is about to send.

// staleUDP decides whether one UDP flow is stale: it is addressed to a
// service address (VIP:port or node port) and answered by something that is
// not a current endpoint, or to a service address that no longer exists.
type staleUDP struct {
	now, before map[netip.AddrPort]map[netip.AddrPort]bool
}

func (s staleUDP) stale(dst, replySrc netip.AddrPort) bool {
	if eps, ok := s.now[dst]; ok {
		return !eps[replySrc]
	}
	_, was := s.before[dst]
	return was
}

// MatchConntrackFlow implements netlink.CustomConntrackFilter.
func (s staleUDP) MatchConntrackFlow(f *netlink.ConntrackFlow) bool {
	if f.Forward.Protocol != unix.IPPROTO_UDP {
		return false
	}
	dst, ok1 := netip.AddrFromSlice(f.Forward.DstIP)
	src, ok2 := netip.AddrFromSlice(f.Reverse.SrcIP)
	if !ok1 || !ok2 {
		return false
	}
	return s.stale(netip.AddrPortFrom(dst.Unmap(), f.Forward.DstPort), netip.AddrPortFrom(src.Unmap(), f.Reverse.SrcPort))
}

// udpChanged reports whether the UDP service map changed at all; only then
// is the conntrack table walked.
func udpChanged(a, b map[netip.AddrPort]map[netip.AddrPort]bool) bool {
	return !maps.EqualFunc(a, b, func(x, y map[netip.AddrPort]bool) bool { return maps.Equal(x, y) })
}

// cleanConntrack deletes stale UDP entries of both families in the
// caller's network namespace.
func cleanConntrack(before, now map[netip.AddrPort]map[netip.AddrPort]bool) (uint, error) {
	f := staleUDP{now: now, before: before}
	n4, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, f)
	if err != nil {
		return n4, err
	}
	n6, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET6, f)
	return n4 + n6, err
}

// udpCleaner deletes the stale UDP conntrack entries after each sync that
// worked, comparing the UDP service map the sync programmed with the one
// before. The first sync walks the table whatever the map: entries may be
// left from before the proxy started.
type udpCleaner struct {
	// clean deletes the entries (cleanConntrack; tests replace it).
	clean func(before, now map[netip.AddrPort]map[netip.AddrPort]bool) (uint, error)

	mu   sync.Mutex
	last map[netip.AddrPort]map[netip.AddrPort]bool
}

// synced takes the UDP service map a sync programmed and returns how many
// entries it deleted.
func (u *udpCleaner) synced(now map[netip.AddrPort]map[netip.AddrPort]bool) (uint, error) {
	u.mu.Lock()
	before := u.last
	u.last = now
	u.mu.Unlock()
	if before != nil && !udpChanged(before, now) {
		return 0, nil
	}
	return u.clean(before, now)
}
