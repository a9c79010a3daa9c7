package wireguard

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// cluster is this node ("self", 10.0.0.1) and n others with keys: node i
// at 10.0.<i/250>.<i%250+2> with the i-th /24 of 100.64.0.0/10 as its pod
// CIDR (self has the 0th).
func cluster(n int) []Node {
	nodes := []Node{node("self", "10.0.0.1", pub(1), "100.64.0.0/24")}
	for i := 1; i <= n; i++ {
		k := uniqueKey(i)
		nodes = append(nodes, Node{Name: fmt.Sprintf("node%04d", i),
			IPs:      []netip.Addr{netip.AddrFrom4([4]byte{10, 0, byte(i / 250), byte(i%250 + 2)})},
			PodCIDRs: []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{100, byte(64 + i>>8), byte(i), 0}), 24)},
			Key:      k.String()})
	}
	return nodes
}

// uniqueKey is a distinct public key per i (not derived from a private one:
// the plan and the fake only compare keys).
func uniqueKey(i int) wgtypes.Key {
	var k wgtypes.Key
	k[0], k[1], k[2] = byte(i), byte(i>>8), 0xaa
	return k
}

func syncer(t testing.TB) (*Syncer, *Fake) {
	priv, _ := key(1)
	f := NewFake(DeviceName)
	return NewSyncer(f, priv, DefaultPort), f
}

func TestSyncerWritesOnlyWhatChanged(t *testing.T) {
	s, f := syncer(t)
	nodes := cluster(3)
	in := Input{Self: "self", Underlay: v4, Nodes: nodes}
	steps := []struct {
		name  string
		edit  func()
		full  bool
		peers int // peer configs written by the step
	}{
		{"first sync is full, with handshakes", func() {}, false, 9}, // each peer added, keepalive on, off
		{"nothing changed", func() {}, false, 0},
		{"node re-addressed", func() { in.Nodes[2].IPs = []netip.Addr{netip.MustParseAddr("10.9.0.3")} }, false, 1},
		{"node loses its key", func() { in.Nodes[3].Key = "" }, false, 1},
		{"node re-keyed", func() { in.Nodes[1].Key = uniqueKey(99).String() }, false, 4}, // old removed, new added, keepalive on, off
		{"node deleted", func() { in.Nodes = in.Nodes[:3] }, false, 0},
		{"node new to this one", func() { in.Nodes = append(in.Nodes, cluster(3)[3]) }, false, 3}, // added, keepalive on, off
		{"full sync of a matching device", func() {}, true, 0},
	}
	for _, st := range steps {
		before := len(f.Configs)
		st.edit()
		plan, err := s.Sync(in, st.full)
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		written := 0
		for _, c := range f.Configs[before:] {
			written += len(c.Peers)
		}
		if written != st.peers {
			t.Errorf("%s: %d peer changes written, want %d", st.name, written, st.peers)
		}
		d, _ := f.Device()
		if got, want := len(d.Peers), len(plan.Peers); got != want {
			t.Errorf("%s: device has %d peers, plan %d", st.name, got, want)
		}
	}
}

func TestSyncerHealsAfterAFailureAndOnFullSync(t *testing.T) {
	s, f := syncer(t)
	in := Input{Self: "self", Underlay: v4, Nodes: cluster(2)}
	if _, err := s.Sync(in, true); err != nil {
		t.Fatal(err)
	}
	// Someone removes a peer behind the syncer's back: an incremental sync
	// does not see it, a full one does.
	d, _ := f.Device()
	if err := f.Configure(wgtypes.Config{Peers: []wgtypes.PeerConfig{{PublicKey: d.Peers[0].PublicKey, Remove: true}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Sync(in, true); err != nil {
		t.Fatal(err)
	}
	if d, _ := f.Device(); len(d.Peers) != 2 {
		t.Errorf("after a full sync: %d peers, want 2", len(d.Peers))
	}
	// A failed write makes the next sync full, even when not asked.
	f.Err = errors.New("netlink: no buffer space")
	in.Nodes = cluster(3)
	if _, err := s.Sync(in, false); err == nil {
		t.Fatal("sync with a failing device succeeded")
	}
	f.Err = nil
	d, _ = f.Device()
	if err := f.Configure(wgtypes.Config{Peers: []wgtypes.PeerConfig{{PublicKey: d.Peers[0].PublicKey, Remove: true}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Sync(in, false); err != nil {
		t.Fatal(err)
	}
	if d, _ := f.Device(); len(d.Peers) != 3 {
		t.Errorf("after a failure and a retry: %d peers, want 3", len(d.Peers))
	}
}

func TestFakeRefusesWhatTheKernelRefuses(t *testing.T) {
	priv, self := key(1)
	cases := []struct {
		name string
		cfg  wgtypes.Config
	}{
		{"zero public key", wgtypes.Config{Peers: []wgtypes.PeerConfig{{PublicKey: wgtypes.Key{}}}}},
		{"this device's own key", wgtypes.Config{PrivateKey: &priv, Peers: []wgtypes.PeerConfig{{PublicKey: self}}}},
		{"allowed IPs of two peers overlap", wgtypes.Config{Peers: []wgtypes.PeerConfig{
			{PublicKey: pub(2), AllowedIPs: ipNets(prefixes("10.244.0.0/16"))},
			{PublicKey: pub(3), AllowedIPs: ipNets(prefixes("10.244.3.0/24"))}}}},
		{"port out of range", wgtypes.Config{ListenPort: new(70000)}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := NewFake(DeviceName)
			if err := f.Configure(c.cfg); err == nil {
				t.Fatal("accepted")
			}
			if d, _ := f.Device(); len(d.Peers) != 0 || d.PrivateKey != (wgtypes.Key{}) {
				t.Errorf("a refused configuration was applied in part: %+v", d)
			}
		})
	}
}

// A peer that leaves stays in the device until the routes to it are gone:
// what was routed into the device meanwhile still finds it. A new one is
// there before its routes.
func TestAPeerLeavesTheDeviceAfterItsRoutes(t *testing.T) {
	nodes := cluster(3)
	cases := []struct {
		name   string
		edit   func(in *Input)
		gone   []wgtypes.Key // left the plan: in the device while routing, not after
		joined []wgtypes.Key // new: in the device while routing
	}{
		{"node deleted", func(in *Input) { in.Nodes = in.Nodes[:3] }, []wgtypes.Key{uniqueKey(3)}, nil},
		{"node turns encryption off", func(in *Input) { in.Nodes[2].Key = "" }, []wgtypes.Key{uniqueKey(2)}, nil},
		{"node re-keyed", func(in *Input) { in.Nodes[1].Key = uniqueKey(99).String() }, []wgtypes.Key{uniqueKey(1)}, []wgtypes.Key{uniqueKey(99)}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, f := syncer(t)
			in := Input{Self: "self", Underlay: v4, Nodes: slices.Clone(nodes)}
			if _, err := s.Sync(in, true); err != nil {
				t.Fatal(err)
			}
			c.edit(&in)
			routed := false
			plan, err := s.SyncRouted(in, false, func(Plan) error {
				routed = true
				d, _ := f.Device()
				for _, k := range append(slices.Clone(c.gone), c.joined...) {
					if !slices.ContainsFunc(d.Peers, func(p wgtypes.Peer) bool { return p.PublicKey == k }) {
						t.Errorf("peer %s is not in the device while the routes are written", k)
					}
				}
				return nil
			})
			if err != nil || !routed {
				t.Fatalf("sync: %v, routed %v", err, routed)
			}
			d, _ := f.Device()
			for _, k := range c.gone {
				if slices.ContainsFunc(d.Peers, func(p wgtypes.Peer) bool { return p.PublicKey == k }) {
					t.Errorf("peer %s is still in the device after the routes", k)
				}
			}
			if len(d.Peers) != len(plan.Peers) {
				t.Errorf("device has %d peers, plan %d", len(d.Peers), len(plan.Peers))
			}
		})
	}
}

// A peer that left stays Linger longer, for what its node still sends
// through the tunnel before it sees the change itself; one that comes back
// meanwhile stays for good.
func TestAPeerThatLeftLingers(t *testing.T) {
	has := func(f *Fake, k wgtypes.Key) bool {
		d, _ := f.Device()
		return slices.ContainsFunc(d.Peers, func(p wgtypes.Peer) bool { return p.PublicKey == k })
	}
	noRoutes := func(Plan) error { return nil }
	steps := []struct {
		name    string
		after   time.Duration // since the start
		key     bool          // node 2 has its key
		present bool          // its peer is in the device after the sync
		leaving bool          // a removal is due later
	}{
		{"node 2 turns encryption off", 0, false, true, true},
		{"a sync before its linger ends", time.Second, false, true, true},
		{"the sync when it ends", 2 * time.Second, false, false, false},
		{"node 2 turns encryption on again", 3 * time.Second, true, true, false},
		{"and off", 4 * time.Second, false, true, true},
		{"and on before its linger ends", 5 * time.Second, true, true, false},
		{"a sync after that linger would have ended", 7 * time.Second, true, true, false},
	}
	s, f := syncer(t)
	s.Linger = 2 * time.Second
	start := time.Unix(1_800_000_000, 0)
	clock := start
	s.now = func() time.Time { return clock }
	nodes := cluster(3)
	k2, _ := wgtypes.ParseKey(nodes[2].Key)
	if _, err := s.SyncRouted(Input{Self: "self", Underlay: v4, Nodes: nodes}, true, noRoutes); err != nil {
		t.Fatal(err)
	}
	for _, st := range steps {
		clock = start.Add(st.after)
		in := Input{Self: "self", Underlay: v4, Nodes: slices.Clone(nodes)}
		if !st.key {
			in.Nodes[2].Key = ""
		}
		if _, err := s.SyncRouted(in, false, noRoutes); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if got := has(f, k2); got != st.present {
			t.Errorf("%s: peer in the device %v, want %v", st.name, got, st.present)
		}
		if _, got := s.Leaving(); got != st.leaving {
			t.Errorf("%s: a removal due %v, want %v", st.name, got, st.leaving)
		}
	}
}
