package wireguard

import (
	"context"
	"net/netip"
	"sync"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// In permissive mode a node sends to a peer in clear until it may send
// through the tunnel. A peer may be sent to through the tunnel once it
// knows this node's key, and the only sign of that is a handshake with it:
// a key this node has just published reaches the peer with its Node watch
// 100-300 ms later, and until then the peer drops this node's handshakes
// and all that was routed to it. So a peer is routed into the device once
// a handshake with it succeeded, and stays routed (its routes in the table
// say so, also to the next agent, which runs with the same key).
// Strict mode routes every peer at once: nothing may leave in clear.

// Routed splits peers into those routed into the device and those still
// waiting for their first handshake: inTable says whether a prefix is
// routed already, handshaken whether a handshake with a key succeeded.
func Routed(peers []Peer, inTable func(netip.Prefix) bool, handshaken func(wgtypes.Key) bool) (routed, waiting []Peer) {
	for _, p := range peers {
		if allRouted(p.AllowedIPs, inTable) || handshaken(p.PublicKey) {
			routed = append(routed, p)
		} else {
			waiting = append(waiting, p)
		}
	}
	return routed, waiting
}

func allRouted(prefixes []netip.Prefix, inTable func(netip.Prefix) bool) bool {
	for _, d := range prefixes {
		if !inTable(d.Masked()) {
			return false
		}
	}
	return len(prefixes) > 0
}

// Handshaken says which peers of dev had a handshake with this device.
func Handshaken(dev *wgtypes.Device) func(wgtypes.Key) bool {
	done := map[wgtypes.Key]bool{}
	for _, p := range dev.Peers {
		if !p.LastHandshakeTime.IsZero() {
			done[p.PublicKey] = true
		}
	}
	return func(k wgtypes.Key) bool { return done[k] }
}

// handshakes watches for the first handshake of the peers a permissive
// sync left waiting, and asks for a sync when one comes. Neither the
// kernel nor wireguard-go tells of a handshake, so the device is read:
// every pollFirst at first (a handshake takes a round trip once the peer
// knows the key), less and less often up to pollAtMost while a peer stays
// silent (a node that is down), and not at all while none waits.
type handshakes struct {
	read    func() (*wgtypes.Device, error)
	request func() // a sync

	mu      sync.Mutex
	waiting []wgtypes.Key
	wake    chan struct{}
}

const (
	pollFirst  = 10 * time.Millisecond
	pollAtMost = time.Second
)

func newHandshakes(read func() (*wgtypes.Device, error), request func()) *handshakes {
	return &handshakes{read: read, request: request, wake: make(chan struct{}, 1)}
}

// wait sets the peers waiting, as the last sync left them.
func (h *handshakes) wait(peers []Peer) {
	keys := make([]wgtypes.Key, 0, len(peers))
	for _, p := range peers {
		keys = append(keys, p.PublicKey)
	}
	h.mu.Lock()
	h.waiting = keys
	h.mu.Unlock()
	if len(keys) > 0 {
		select {
		case h.wake <- struct{}{}:
		default:
		}
	}
}

// run watches until ctx ends.
func (h *handshakes) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.wake:
		}
		every := pollFirst
		for waiting := true; waiting; {
			select {
			case <-ctx.Done():
				return
			case <-h.wake: // another sync set who waits: poll quickly again
				every = pollFirst
				continue
			case <-time.After(every):
			}
			every = min(2*every, pollAtMost)
			var came bool
			if came, waiting = h.check(); came {
				h.request()
			}
		}
	}
}

// check reads the device: whether a waiting peer has had its handshake
// (then none waits any more: the sync that asks for sets who still does),
// and whether any still waits.
func (h *handshakes) check() (came, waiting bool) {
	h.mu.Lock()
	keys := h.waiting
	h.mu.Unlock()
	if len(keys) == 0 {
		return false, false
	}
	dev, err := h.read()
	if err != nil {
		return false, true
	}
	done := Handshaken(dev)
	for _, k := range keys {
		if done(k) {
			h.mu.Lock()
			h.waiting = nil
			h.mu.Unlock()
			return true, false
		}
	}
	return false, true
}
