package wireguard_test

import (
	"testing"
	"time"
)

// TestHeldConnectionSurvivesRestartAndKeyRotation: node 1's device is
// closed and opened again, as a restart of the node role does, with its
// key kept or (key file deleted) a new one; node 2 learns the new key from
// node 1's Node and updates its peer incrementally. A TCP connection held
// from node 2 to node 1 across it answers again, and node 2 ends with one
// peer for node 1, under the key node 1 now has.
func TestHeldConnectionSurvivesRestartAndKeyRotation(t *testing.T) {
	for _, c := range []struct {
		name   string
		rotate bool
	}{{"restart keeps the key", false}, {"deleted key file rotates the key", true}} {
		t.Run(c.name, func(t *testing.T) {
			l := newLab(t, 2)
			l.syncAll(t)
			a, b := l.nodes[0], l.nodes[1]
			// A restarted node makes a handshake with its peers at once; a
			// lost one is sent again after 5 s, which the wait for an
			// answer allows.
			conn, err := b.ns.DialEcho(at(a.podIP()), 3*echoTimeout+5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if seen, err := conn.Seen(); err != nil || seen != b.podIP() {
				t.Fatalf("before the restart: seen %q, %v", seen, err)
			}
			old := a.key
			l.restart(t, a, c.rotate)
			if rotated := a.key != old; rotated != c.rotate {
				t.Fatalf("key changed %v, want %v", rotated, c.rotate)
			}
			l.sync(t, a, true)
			l.sync(t, b, false) // the annotation's change, incrementally
			if seen, err := conn.Seen(); err != nil || seen != b.podIP() {
				t.Errorf("held connection after the restart: seen %q, %v", seen, err)
			}
			d, err := b.dev.Device()
			if err != nil {
				t.Fatal(err)
			}
			if len(d.Peers) != 1 || d.Peers[0].PublicKey != a.key.PublicKey() {
				t.Errorf("node 2 has %d peers; want one, with node 1's current key", len(d.Peers))
			}
		})
	}
}
