package wireguard

import (
	"net/netip"
	"testing"
	"time"
)

// syncThousand is a Syncer that has synced this node and 1,000 others to
// dev (a Fake when nil), and the input it synced.
func syncThousand(tb testing.TB, dev Device) (*Syncer, Input) {
	s, _ := syncer(tb)
	if dev != nil {
		priv, _ := key(1)
		s = NewSyncer(dev, priv, DefaultPort)
	}
	in := Input{Self: "self", Underlay: v4, Nodes: cluster(1000)}
	if _, err := s.Sync(in, true); err != nil {
		tb.Fatal(err)
	}
	return s, in
}

// withNewNode is in with one more node, number 1001.
func withNewNode(in Input) Input {
	in.Nodes = append(in.Nodes[:len(in.Nodes):len(in.Nodes)], Node{Name: "node1001",
		IPs:      []netip.Addr{netip.MustParseAddr("10.0.9.9")},
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("100.80.0.0/24")}, Key: uniqueKey(1001).String()})
	return in
}

// TestPeerSyncOfAThousandNodesWithinASecond holds the plan and the full
// sync of 1,000 Nodes to a second, and one new Node's incremental sync to
// 100 ms, best of three trials (other work shares this machine).
func TestPeerSyncOfAThousandNodesWithinASecond(t *testing.T) {
	full, one := time.Hour, time.Hour
	for range 3 {
		start := time.Now()
		s, in := syncThousand(t, nil)
		full = min(full, time.Since(start))
		start = time.Now()
		plan, err := s.Sync(withNewNode(in), false)
		one = min(one, time.Since(start))
		if err != nil || len(plan.Peers) != 1001 {
			t.Fatalf("after the new node: %d peers, %v", len(plan.Peers), err)
		}
	}
	t.Logf("1,000 Nodes: full sync %v; one new Node %v", full, one)
	if full > time.Second || one > 100*time.Millisecond {
		t.Errorf("full sync %v (bound 1 s), one new Node %v (bound 100 ms)", full, one)
	}
}

// BenchmarkPeerPlan measures, for 1,000 Nodes, the plan alone, then the
// first (full) sync and the incremental sync of one new Node, each to the
// Fake and to wireguard-go itself (on a channel TUN with a silent bind,
// so through its configuration protocol without root).
func BenchmarkPeerPlan(b *testing.B) {
	in := Input{Self: "self", Underlay: v4, Nodes: cluster(1000)}
	b.Run("plan-1000", func(b *testing.B) {
		for b.Loop() {
			Desired(in)
		}
	})
	devices := map[string]func(b *testing.B) Device{
		"fake":      func(*testing.B) Device { return NewFake(DeviceName) },
		"userspace": func(b *testing.B) Device { return silentUserspace(b) },
	}
	for _, name := range []string{"fake", "userspace"} {
		b.Run(name+"/full-sync-1000", func(b *testing.B) {
			for b.Loop() {
				syncThousand(b, devices[name](b))
			}
		})
		b.Run(name+"/one-new-node", func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				s, in := syncThousand(b, devices[name](b))
				b.StartTimer()
				if _, err := s.Sync(withNewNode(in), false); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
