package wireguard

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Fake is an in-memory Device for tests of what drives a device. It
// applies a configuration as the kernel does (all or nothing; UpdateOnly
// and Remove of an unknown peer are no-ops; a peer's allowed IPs are
// masked) and refuses what the kernel refuses (a port out of range, a
// zero or this device's own public key for a peer, an invalid allowed IP).
// It is stricter in one way: an allowed IP that overlaps another peer's is
// refused, where the kernel silently moves it to the last peer, since a
// plan that asks for it has a bug.
type Fake struct {
	mu      sync.Mutex
	dev     wgtypes.Device
	Configs []wgtypes.Config // every configuration applied, in order
	Err     error            // when set, Configure fails with it
	closed  bool
}

// NewFake is an empty device named name.
func NewFake(name string) *Fake { return &Fake{dev: wgtypes.Device{Name: name}} }

// Configure applies cfg, or nothing when it is refused.
func (f *Fake) Configure(cfg wgtypes.Config) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return errors.New("fake WireGuard device: closed")
	}
	if f.Err != nil {
		return f.Err
	}
	next := cloneDevice(f.dev)
	if cfg.PrivateKey != nil {
		next.PrivateKey, next.PublicKey = *cfg.PrivateKey, cfg.PrivateKey.PublicKey()
	}
	if cfg.ListenPort != nil {
		if *cfg.ListenPort < 0 || *cfg.ListenPort > 65535 {
			return fmt.Errorf("fake WireGuard device: listen port %d: invalid argument", *cfg.ListenPort)
		}
		next.ListenPort = *cfg.ListenPort
	}
	if cfg.ReplacePeers {
		next.Peers = nil
	}
	for _, pc := range cfg.Peers {
		if err := applyPeer(&next, pc); err != nil {
			return fmt.Errorf("fake WireGuard device: peer %s: %w", pc.PublicKey, err)
		}
	}
	if err := overlapping(next.Peers, cfg.Peers); err != nil {
		return fmt.Errorf("fake WireGuard device: %w", err)
	}
	f.dev = next
	f.Configs = append(f.Configs, cfg)
	return nil
}

func applyPeer(d *wgtypes.Device, pc wgtypes.PeerConfig) error {
	if pc.PublicKey == (wgtypes.Key{}) || pc.PublicKey == d.PublicKey {
		return errors.New("invalid public key")
	}
	i := slices.IndexFunc(d.Peers, func(p wgtypes.Peer) bool { return p.PublicKey == pc.PublicKey })
	switch {
	case pc.Remove:
		if i >= 0 {
			d.Peers = slices.Delete(d.Peers, i, i+1)
		}
		return nil
	case i < 0 && pc.UpdateOnly:
		return nil
	case i < 0:
		d.Peers = append(d.Peers, wgtypes.Peer{PublicKey: pc.PublicKey, ProtocolVersion: 1})
		i = len(d.Peers) - 1
	}
	p := &d.Peers[i]
	if pc.Endpoint != nil {
		p.Endpoint = pc.Endpoint
	}
	if pc.ReplaceAllowedIPs {
		p.AllowedIPs = nil
	}
	for _, n := range pc.AllowedIPs {
		ones, bits := n.Mask.Size()
		if bits == 0 || (bits == 32) != (n.IP.To4() != nil) {
			return fmt.Errorf("allowed IP %s: invalid argument", n.String())
		}
		ip := net.IPNet{IP: n.IP.Mask(n.Mask), Mask: net.CIDRMask(ones, bits)}
		// As in WireGuard, a prefix another peer has moves to this one.
		for j := range d.Peers {
			if j != i {
				d.Peers[j].AllowedIPs = slices.DeleteFunc(d.Peers[j].AllowedIPs, func(o net.IPNet) bool { return o.String() == ip.String() })
			}
		}
		p = &d.Peers[i]
		p.AllowedIPs = append(p.AllowedIPs, ip)
	}
	return nil
}

// overlapping says which allowed IPs a configured peer shares with
// another peer; the others were checked when they were configured.
func overlapping(peers []wgtypes.Peer, configured []wgtypes.PeerConfig) error {
	touched := map[wgtypes.Key]bool{}
	for _, pc := range configured {
		touched[pc.PublicKey] = true
	}
	for _, a := range peers {
		if !touched[a.PublicKey] {
			continue
		}
		for _, b := range peers {
			if b.PublicKey == a.PublicKey {
				continue
			}
			for _, x := range a.AllowedIPs {
				for _, y := range b.AllowedIPs {
					if x.Contains(y.IP) || y.Contains(x.IP) {
						return fmt.Errorf("allowed IP %s of peer %s overlaps %s of peer %s", x.String(), a.PublicKey, y.String(), b.PublicKey)
					}
				}
			}
		}
	}
	return nil
}

// Device is a copy of the device's state.
func (f *Fake) Device() (*wgtypes.Device, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil, errors.New("fake WireGuard device: closed")
	}
	d := cloneDevice(f.dev)
	return &d, nil
}

// Close closes the device.
func (f *Fake) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	return nil
}

// Handshake records a handshake with peer at t and bytes both ways, as
// traffic would.
func (f *Fake) Handshake(peer wgtypes.Key, at time.Time, tx, rx int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.dev.Peers {
		if p := &f.dev.Peers[i]; p.PublicKey == peer {
			p.LastHandshakeTime = at
			p.TransmitBytes += tx
			p.ReceiveBytes += rx
		}
	}
}

func cloneDevice(d wgtypes.Device) wgtypes.Device {
	d.Peers = slices.Clone(d.Peers)
	for i := range d.Peers {
		d.Peers[i].AllowedIPs = slices.Clone(d.Peers[i].AllowedIPs)
	}
	return d
}
