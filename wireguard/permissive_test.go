package wireguard

import (
	"context"
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

func TestRoutedAfterAHandshakeOrWhenRoutedBefore(t *testing.T) {
	a := peer("a", "10.0.0.2:51820", pub(2), "10.244.2.0/24")
	b := peer("b", "10.0.0.3:51820", pub(3), "10.244.3.0/24", "fd00:10:244:3::/64")
	for _, tc := range []struct {
		name            string
		table           []string
		handshaken      []wgtypes.Key
		routed, waiting []string
	}{
		{"no handshake, nothing routed: both wait", nil, nil, nil, []string{"a", "b"}},
		{"a handshake with a", nil, []wgtypes.Key{pub(2)}, []string{"a"}, []string{"b"}},
		{"routed before (the agent before, same key)", []string{"10.244.2.0/24"}, nil, []string{"a"}, []string{"b"}},
		{"only one family of b routed: b waits", []string{"10.244.3.0/24"}, nil, nil, []string{"a", "b"}},
		{"both ways", []string{"10.244.3.0/24", "fd00:10:244:3::/64"}, []wgtypes.Key{pub(2)}, []string{"a", "b"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inTable := func(p netip.Prefix) bool { return slices.Contains(tc.table, p.String()) }
			done := func(k wgtypes.Key) bool { return slices.Contains(tc.handshaken, k) }
			routed, waiting := Routed([]Peer{a, b}, inTable, done)
			if got := names(routed); !slices.Equal(got, tc.routed) {
				t.Errorf("routed %v, want %v", got, tc.routed)
			}
			if got := names(waiting); !slices.Equal(got, tc.waiting) {
				t.Errorf("waiting %v, want %v", got, tc.waiting)
			}
		})
	}
}

func names(ps []Peer) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Node)
	}
	return out
}

// The watch asks for a sync once a waiting peer's handshake shows on the
// device, and reads nothing while none waits.
func TestHandshakesAskForASyncWhenOneComes(t *testing.T) {
	var shaken atomic.Bool
	var reads atomic.Int32
	read := func() (*wgtypes.Device, error) {
		reads.Add(1)
		p := wgtypes.Peer{PublicKey: pub(2)}
		if shaken.Load() {
			p.LastHandshakeTime = time.Now()
		}
		return &wgtypes.Device{Peers: []wgtypes.Peer{p}}, nil
	}
	synced := make(chan struct{}, 1)
	h := newHandshakes(read, func() { synced <- struct{}{} })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go h.run(ctx)

	h.wait(nil)
	time.Sleep(5 * pollFirst)
	if n := reads.Load(); n != 0 {
		t.Fatalf("read the device %d times with no peer waiting", n)
	}
	h.wait([]Peer{{Node: "a", PublicKey: pub(2)}})
	select {
	case <-synced:
		t.Fatal("asked for a sync before any handshake")
	case <-time.After(5 * pollFirst):
	}
	shaken.Store(true)
	select {
	case <-synced:
	case <-time.After(time.Second):
		t.Fatal("no sync asked within a second of the handshake")
	}
	// It stops polling until a sync sets who waits again.
	after := reads.Load()
	time.Sleep(5 * pollFirst)
	if n := reads.Load(); n != after {
		t.Fatalf("read the device %d more times after the handshake came", n-after)
	}
}
