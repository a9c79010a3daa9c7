package dns

import (
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/netplane/netplane/apis/config/v1alpha1"
)

// servers are the upstream servers one route sends its names to. A cached
// answer remembers the servers it came from: it is valid only while its
// name still routes to the same servers.
type servers struct {
	addrs []string // host:port
	next  atomic.Uint32
}

// routes say where a name outside the cluster zone goes: the servers of the
// longest stub domain the name is in, else the upstream servers. Immutable
// once built; a configuration change builds new routes and swaps them in.
type routes struct {
	stubs    map[string]*servers // by lowercase FQDN
	upstream *servers
}

// forwarding is the settings routes are built from: stub domains (any
// case, with or without the trailing dot) and the upstream servers, each
// server an IP or IP:port.
type forwarding struct {
	stubs     map[string][]string
	upstreams []string
}

// newRoutes builds the routes of fw. Every route whose servers are those
// prev gives it keeps prev's servers, so its cached answers stay valid
// across the change.
func newRoutes(fw forwarding, prev *routes) *routes {
	reuse := func(old *servers, addrs []string) *servers {
		if old != nil && slices.Equal(old.addrs, addrs) {
			return old
		}
		return &servers{addrs: addrs}
	}
	r := &routes{stubs: map[string]*servers{}}
	var prevUp *servers
	if prev != nil {
		prevUp = prev.upstream
	}
	r.upstream = reuse(prevUp, hostPorts(fw.upstreams))
	for d, addrs := range fw.stubs {
		d = v1alpha1.StubDomain(d)
		var old *servers
		if prev != nil {
			old = prev.stubs[d]
		}
		r.stubs[d] = reuse(old, hostPorts(addrs))
	}
	return r
}

// hostPorts gives each server its port, 53 when it has none.
func hostPorts(addrs []string) []string {
	out := make([]string, 0, len(addrs))
	for _, a := range addrs {
		if ip, err := netip.ParseAddr(a); err == nil {
			a = net.JoinHostPort(ip.String(), "53")
		}
		out = append(out, a)
	}
	return out
}

// route is the servers of name, a lowercase FQDN: those of the longest stub
// domain that is name or one of its parents, else the upstream servers.
// One map lookup per label, without allocating.
func (r *routes) route(name string) *servers {
	if len(r.stubs) == 0 {
		return r.upstream
	}
	for i := 0; i < len(name); {
		if s, ok := r.stubs[name[i:]]; ok {
			return s
		}
		dot := strings.IndexByte(name[i:], '.')
		if dot < 0 {
			break
		}
		i += dot + 1
	}
	return r.upstream
}

// String is the routes as logged: each stub domain with its servers, then
// the upstream servers under ".".
func (r *routes) String() string {
	var b strings.Builder
	for _, d := range slices.Sorted(maps.Keys(r.stubs)) {
		b.WriteString(d + "→" + strings.Join(r.stubs[d].addrs, ",") + " ")
	}
	b.WriteString(".→" + strings.Join(r.upstream.addrs, ","))
	return b.String()
}
