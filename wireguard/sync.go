package wireguard

import (
	"errors"
	"fmt"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Syncer converges a Device to the plan of the Node facts. A full sync
// reads the device back and heals every difference (at start, every
// --sync-period, after a failure); any other sync writes only the
// difference between the last plan it applied and the new one, so its
// cost grows with the change and the device is not read.
type Syncer struct {
	dev  Device
	key  wgtypes.Key // this node's private key
	port int

	started bool   // the first sync, which makes a handshake with every peer, is done
	applied []Peer // the peers as last written
	valid   bool   // applied is what the device holds; false: the next sync is full

	// Linger keeps a peer that left the plan in the device this long after
	// the routes to it went (SyncRouted): its node sends through the
	// tunnel until it has seen the change itself, and a node that turns
	// encryption off stops only once it has removed its own routes.
	Linger  time.Duration
	leaving map[wgtypes.Key]time.Time // left the plan, in the device until
	now     func() time.Time
}

// NewSyncer drives dev as this node's device with its private key and port.
func NewSyncer(dev Device, key wgtypes.Key, port int) *Syncer {
	return &Syncer{dev: dev, key: key, port: port, leaving: map[wgtypes.Key]time.Time{}, now: time.Now}
}

// Sync plans the peers of in and writes them to the device; full reads
// the device back first and heals it. The plan is returned also on error,
// for reporting.
func (s *Syncer) Sync(in Input, full bool) (Plan, error) { return s.SyncRouted(in, full, nil) }

// SyncRouted is Sync with route called on the plan between the peers'
// additions and changes and their removals: a peer that left the plan
// stays in the device until route has taken the routes to it away, so
// that a packet routed into the device meanwhile still finds its peer
// (a node turning encryption off, in permissive mode, is sent to by the
// overlay from then on), and Linger longer (Leaving says until when). A
// peer comes before the routes to it.
func (s *Syncer) SyncRouted(in Input, full bool, route func(Plan) error) (Plan, error) {
	in.PublicKey = s.key.PublicKey()
	in.Port = s.port
	plan := Desired(in)
	var cfg wgtypes.Config
	if full || !s.valid {
		dev, err := s.dev.Device()
		if err != nil {
			s.valid = false
			return plan, err
		}
		cfg = Heal(dev, s.key, s.port, plan)
		if !s.started {
			cfg.Peers = append(cfg.Peers, Handshake(plan.Peers)...)
		}
	} else {
		cfg.Peers = Diff(s.applied, plan.Peers)
	}
	if s.started {
		cfg.Peers = append(cfg.Peers, Handshake(Unmet(s.applied, plan.Peers))...)
	}
	var gone []wgtypes.PeerConfig
	if route != nil {
		cfg.Peers, gone = removals(cfg.Peers)
	}
	if !Empty(cfg) {
		if err := s.dev.Configure(cfg); err != nil {
			s.valid = false
			return plan, fmt.Errorf("%d peer changes: %w", len(cfg.Peers), err)
		}
	}
	s.applied, s.valid, s.started = plan.Peers, true, true
	if route == nil {
		return plan, nil
	}
	err := route(plan)
	if due := s.due(gone, plan); len(due) > 0 {
		if cerr := s.dev.Configure(wgtypes.Config{Peers: due}); cerr != nil {
			s.valid = false
			return plan, errors.Join(err, fmt.Errorf("remove %d peers: %w", len(due), cerr))
		}
		for _, p := range due {
			delete(s.leaving, p.PublicKey)
		}
	}
	return plan, err
}

// due are the removals whose Linger is over, gone being those of this
// sync; a peer back in the plan no longer leaves.
func (s *Syncer) due(gone []wgtypes.PeerConfig, plan Plan) []wgtypes.PeerConfig {
	now := s.now()
	for _, g := range gone {
		if _, ok := s.leaving[g.PublicKey]; !ok {
			s.leaving[g.PublicKey] = now.Add(s.Linger)
		}
	}
	for _, p := range plan.Peers {
		delete(s.leaving, p.PublicKey)
	}
	var out []wgtypes.PeerConfig
	for k, until := range s.leaving {
		if !now.Before(until) {
			out = append(out, wgtypes.PeerConfig{PublicKey: k, Remove: true})
		}
	}
	return out
}

// Leaving is when the next peer that left the plan is due to go: a sync
// then removes it.
func (s *Syncer) Leaving() (time.Time, bool) {
	var next time.Time
	for _, until := range s.leaving {
		if next.IsZero() || until.Before(next) {
			next = until
		}
	}
	return next, !next.IsZero()
}

// removals splits the removals off peers.
func removals(peers []wgtypes.PeerConfig) (rest, gone []wgtypes.PeerConfig) {
	for _, p := range peers {
		if p.Remove {
			gone = append(gone, p)
		} else {
			rest = append(rest, p)
		}
	}
	return rest, gone
}

// Fresh is how recent a handshake must be for a peer to count as up:
// WireGuard renews a peer's keys every 2 minutes while they carry
// traffic, and gives up on them after 3.
const Fresh = 3 * time.Minute

// Stats are the counts an operator watches, read from a device and a plan.
type Stats struct {
	Up, Stale, NoKey int   // peers with a handshake within Fresh, other peers, nodes rejected (no valid key, address or a conflict)
	TxBytes, RxBytes int64 // through the device, all peers
}

// StatsOf counts dev's peers at now; plan gives the rejected nodes.
func StatsOf(dev *wgtypes.Device, plan Plan, now time.Time) Stats {
	var st Stats
	for _, p := range dev.Peers {
		if !p.LastHandshakeTime.IsZero() && now.Sub(p.LastHandshakeTime) < Fresh {
			st.Up++
		} else {
			st.Stale++
		}
		st.TxBytes += p.TransmitBytes
		st.RxBytes += p.ReceiveBytes
	}
	st.NoKey = len(plan.Rejected)
	return st
}

// Unmet are the peers of desired whose key current did not have: a node
// new to this one, or one that restarted with a new key. Its own
// handshakes went out before this node knew the key and were dropped, and
// it retries only after WireGuard's 5 s; a handshake from this side as
// soon as the key is known gets their traffic going at once (and, in
// permissive mode, routes them into the device: permissive.go).
func Unmet(current, desired []Peer) []Peer {
	had := make(map[wgtypes.Key]bool, len(current))
	for _, p := range current {
		had[p.PublicKey] = true
	}
	var out []Peer
	for _, p := range desired {
		if !had[p.PublicKey] {
			out = append(out, p)
		}
	}
	return out
}
