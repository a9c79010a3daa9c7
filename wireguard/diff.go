package wireguard

import (
	"net"
	"net/netip"
	"slices"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Diff is the peer configuration that turns the current peers into the
// desired ones and touches nothing else: a peer no longer desired is
// removed, a new one added with its endpoint and allowed IPs, one that
// changed updated (UpdateOnly) in just the fields that differ. Removals
// come first, so that a node's new key takes over its allowed IPs from its
// old one in the same configuration. Nil when nothing differs.
func Diff(current, desired []Peer) []wgtypes.PeerConfig {
	cur := make(map[wgtypes.Key]*Peer, len(current))
	for i := range current {
		cur[current[i].PublicKey] = &current[i]
	}
	want := make(map[wgtypes.Key]bool, len(desired))
	for _, d := range desired {
		want[d.PublicKey] = true
	}
	var out []wgtypes.PeerConfig
	for _, c := range current {
		if !want[c.PublicKey] {
			out = append(out, wgtypes.PeerConfig{PublicKey: c.PublicKey, Remove: true})
		}
	}
	slices.SortFunc(out, func(a, b wgtypes.PeerConfig) int { return slices.Compare(a.PublicKey[:], b.PublicKey[:]) })
	for _, d := range desired {
		c, ok := cur[d.PublicKey]
		if !ok {
			out = append(out, wgtypes.PeerConfig{PublicKey: d.PublicKey, Endpoint: udpAddr(d.Endpoint),
				ReplaceAllowedIPs: true, AllowedIPs: ipNets(d.AllowedIPs)})
			continue
		}
		pc := wgtypes.PeerConfig{PublicKey: d.PublicKey, UpdateOnly: true}
		if c.Endpoint != d.Endpoint {
			pc.Endpoint = udpAddr(d.Endpoint)
		}
		if !slices.Equal(c.AllowedIPs, d.AllowedIPs) {
			pc.ReplaceAllowedIPs, pc.AllowedIPs = true, ipNets(d.AllowedIPs)
		}
		if pc.Endpoint != nil || pc.ReplaceAllowedIPs {
			out = append(out, pc)
		}
	}
	return out
}

// Handshake makes each peer's handshake at once rather than on its first
// packet: its persistent keepalive is turned on, which both implementations
// answer with a keepalive (and so a handshake), and off again (WireGuard's
// default) later in the same configuration.
//
// A node makes it with every peer when its device starts: the keys of the
// userspace device's handshakes died with the old process, and its peers
// would send with keys it no longer has until they time out (15 s); after
// the handshake they switch to the new keys at once. Only the starting node does, never the peers
// that add a new node: two handshakes that cross each other both fail, and
// are retried only after 5 s.
func Handshake(peers []Peer) []wgtypes.PeerConfig {
	out := make([]wgtypes.PeerConfig, 0, 2*len(peers))
	for _, on := range []*time.Duration{&keepaliveOn, &keepaliveOff} {
		for _, p := range peers {
			out = append(out, wgtypes.PeerConfig{PublicKey: p.PublicKey, UpdateOnly: true, PersistentKeepaliveInterval: on})
		}
	}
	return out
}

var keepaliveOn, keepaliveOff = 25 * time.Second, time.Duration(0)

// Heal is the configuration that turns the device as read back (dev) into
// the plan with this node's key and port: Diff of its peers, and the key
// and port where they differ. Its Peers are nil when the peers match.
func Heal(dev *wgtypes.Device, key wgtypes.Key, port int, plan Plan) wgtypes.Config {
	var cfg wgtypes.Config
	if dev.PrivateKey != key {
		cfg.PrivateKey = &key
	}
	if dev.ListenPort != port {
		cfg.ListenPort = &port
	}
	cfg.Peers = Diff(PeersOf(dev), plan.Peers)
	return cfg
}

// Empty says whether cfg changes nothing.
func Empty(cfg wgtypes.Config) bool {
	return cfg.PrivateKey == nil && cfg.ListenPort == nil && cfg.FirewallMark == nil && !cfg.ReplacePeers && len(cfg.Peers) == 0
}

// PeersOf are a device's peers in the plan's terms, without node names.
func PeersOf(dev *wgtypes.Device) []Peer {
	out := make([]Peer, 0, len(dev.Peers))
	for _, p := range dev.Peers {
		var ep netip.AddrPort
		if p.Endpoint != nil {
			ep = p.Endpoint.AddrPort()
			ep = netip.AddrPortFrom(ep.Addr().Unmap(), ep.Port())
		}
		ips := make([]netip.Prefix, 0, len(p.AllowedIPs))
		for _, n := range p.AllowedIPs {
			if pfx, ok := prefixOf(n); ok {
				ips = append(ips, pfx)
			}
		}
		slices.SortFunc(ips, comparePrefix)
		out = append(out, Peer{PublicKey: p.PublicKey, Endpoint: ep, AllowedIPs: ips})
	}
	return out
}

func udpAddr(ap netip.AddrPort) *net.UDPAddr { return net.UDPAddrFromAddrPort(ap) }

func ipNets(ps []netip.Prefix) []net.IPNet {
	out := make([]net.IPNet, 0, len(ps))
	for _, p := range ps {
		out = append(out, net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())})
	}
	return out
}

func prefixOf(n net.IPNet) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, bits := n.Mask.Size()
	if bits == 32 {
		a = a.Unmap()
	}
	return netip.PrefixFrom(a, ones).Masked(), true
}
