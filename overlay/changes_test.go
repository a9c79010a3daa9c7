package overlay_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/netplane/netplane/e2e/netns"
	"github.com/netplane/netplane/nodeview"
	"github.com/netplane/netplane/overlay"
)

var both = []nodeview.Family{nodeview.IPv4, nodeview.IPv6}

func TestSameSubnetTrafficIsEncapsulatedOnlyUnderAlways(t *testing.T) {
	l := newLab(t)
	serve(t, l.node(2).pod)
	serve(t, l.node(3).pod)
	l.sync(t, crossSubnet)
	n1 := l.node(1)
	counters(t, n1.ns)
	for _, f := range both {
		expectSeen(t, n1.pod, l.pod(2, f), l.pod(1, f))
	}
	if c := count(t, n1.ns, "p4789"); c != 0 {
		t.Errorf("cross-subnet: %d packets to UDP 4789 for traffic within the subnet, want 0", c)
	}
	for _, f := range both {
		expectSeen(t, n1.pod, l.pod(3, f), l.pod(1, f))
	}
	across := count(t, n1.ns, "p4789")
	if across == 0 {
		t.Errorf("cross-subnet: no packet to UDP 4789 for traffic across subnets")
	}
	l.sync(t, always)
	for _, f := range both {
		expectSeen(t, n1.pod, l.pod(2, f), l.pod(1, f))
	}
	if c := count(t, n1.ns, "p4789"); c <= across {
		t.Errorf("always: %d packets to UDP 4789 after traffic within the subnet, want more than %d", c, across)
	}
}

func TestPortAndVNIAreHonouredAndAChangeRecreatesTheDevice(t *testing.T) {
	l := newLab(t)
	serve(t, l.node(3).pod)
	serve(t, l.node(1).pod)
	l.sync(t, crossSubnet)
	n1 := l.node(1)
	counters(t, n1.ns)
	l.sync(t, overlay.Config{Mode: overlay.CrossSubnet, Port: 8472, VNI: 42})
	for _, dev := range []string{overlay.DeviceV4, overlay.DeviceV6} {
		d := n1.show(t, "ip", "-d", "link", "show", dev)
		if !strings.Contains(d, "vxlan id 42 ") || !strings.Contains(d, "dstport 8472 ") || !strings.Contains(d, "nolearning") {
			t.Errorf("%s after the change: %s\nwant id 42, dstport 8472, nolearning", dev, d)
		}
	}
	for _, f := range both {
		expectSeen(t, n1.pod, l.pod(3, f), l.pod(1, f))
		expectSeen(t, l.node(3).pod, l.pod(1, f), l.pod(3, f))
	}
	if c := count(t, n1.ns, "p4789"); c != 0 {
		t.Errorf("%d packets to UDP 4789 after moving to 8472, want 0", c)
	}
	if c, all := count(t, n1.ns, "p8472v42"), count(t, n1.ns, "p8472"); c == 0 || c != all {
		t.Errorf("%d packets to UDP 8472 with VNI 42 of %d to UDP 8472; want all, and some", c, all)
	}
}

func TestSyncHealsWhatOthersDeletedOrAdded(t *testing.T) {
	l := newLab(t)
	serve(t, l.node(3).pod)
	l.sync(t, crossSubnet)
	n1 := l.node(1)
	want := n1.ours(t)
	mac := overlay.MAC(netip.MustParseAddr("192.168.20.13")).String()
	n1.show(t, "ip", "route", "del", "10.244.3.0/24")
	n1.show(t, "ip", "neigh", "del", "192.168.20.13", "dev", overlay.DeviceV4)
	n1.show(t, "bridge", "fdb", "del", mac, "dev", overlay.DeviceV4, "dst", "192.168.20.13")
	n1.show(t, "ip", "link", "del", overlay.DeviceV6)
	n1.show(t, "bridge", "fdb", "append", "0e:6e:c0:a8:14:63", "dev", overlay.DeviceV4, "dst", "192.168.20.99")
	n1.show(t, "ip", "route", "add", "10.99.0.0/24", "via", "192.168.10.12", "proto", "207")
	n1.show(t, "ip", "route", "add", "10.98.0.0/24", "via", "192.168.10.12", "proto", "static")
	for _, f := range both {
		expectUnreachable(t, n1.pod, l.pod(3, f))
	}
	l.sync(t, crossSubnet)
	if got := n1.ours(t); got != want {
		t.Errorf("after the sync, node1 has:\n%s\nwant, as before the deletions:\n%s", got, want)
	}
	if !strings.Contains(n1.show(t, "ip", "route", "show", "10.98.0.0/24"), "10.98.0.0/24") {
		t.Error("the sync removed a route of another owner (protocol static)")
	}
	for _, f := range both {
		expectSeen(t, n1.pod, l.pod(3, f), l.pod(1, f))
	}
}

func TestRemovedAndChangedNodesAreFollowed(t *testing.T) {
	l := newLab(t)
	serve(t, l.node(1).pod)
	serve(t, l.node(3).pod)
	l.sync(t, crossSubnet)
	n1, n3 := l.node(1), l.node(3)

	l.syncFacts(t, crossSubnet, l.facts()[:2])
	if got := n1.ours(t); strings.Contains(got, "20.13") || strings.Contains(got, "244.3.") || strings.Contains(got, "fd00:b::13") {
		t.Errorf("node3 is gone but node1 still has:\n%s", got)
	}

	// node3 moves to other addresses and a new pod CIDR.
	n3.show(t, "ip", "addr", "flush", "dev", "eth0", "scope", "global")
	n3.ns.Addr(t, "eth0", "192.168.20.23/24")
	n3.ns.Addr(t, "eth0", "fd00:b::23/64")
	n3.show(t, "ip", "-4", "route", "replace", "default", "via", "192.168.20.254")
	n3.show(t, "ip", "-6", "route", "replace", "default", "via", "fd00:b::fe")
	n3.show(t, "ip", "addr", "del", "10.244.3.1/24", "dev", "cni0")
	n3.ns.Addr(t, "cni0", "10.244.30.1/24")
	n3.pod.MustExec(t, "ip", "-4", "addr", "flush", "dev", "eth0")
	n3.pod.Addr(t, "eth0", "10.244.30.2/24")
	n3.pod.Route(t, "default", "via", "10.244.30.1")
	n3.IPs = []netip.Addr{netip.MustParseAddr("192.168.20.23"), netip.MustParseAddr("fd00:b::23")}
	n3.PodCIDRs[0] = netip.MustParsePrefix("10.244.30.0/24")
	l.sync(t, crossSubnet)
	got := n1.ours(t)
	if strings.Contains(got, "20.13") || strings.Contains(got, "244.3.") || strings.Contains(got, "fd00:b::13") ||
		!strings.Contains(got, "10.244.30.0/24 via 192.168.20.23 dev netplane.vxlan") || !strings.Contains(got, "fd00:b::23") {
		t.Errorf("node3 moved to 192.168.20.23, fd00:b::23, 10.244.30.0/24; node1 has:\n%s", got)
	}
	expectSeen(t, n1.pod, "10.244.30.2", l.pod(1, nodeview.IPv4))
	expectSeen(t, n1.pod, l.pod(3, nodeview.IPv6), l.pod(1, nodeview.IPv6))
	expectSeen(t, n3.pod, l.pod(1, nodeview.IPv4), "10.244.30.2")
}

func TestModeSwitchesConvergeAndKeepPodConnections(t *testing.T) {
	l := newLab(t)
	serve(t, l.node(2).pod)
	serve(t, l.node(3).pod)
	n1 := l.node(1)
	l.sync(t, never)
	c, err := dial(n1.pod, l.pod(2, nodeview.IPv4))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, step := range []struct {
		cfg    overlay.Config
		device bool
	}{{crossSubnet, true}, {always, true}, {crossSubnet, true}, {never, false}, {always, true}, {never, false}} {
		l.sync(t, step.cfg)
		_, err := n1.ns.Exec("ip", "link", "show", overlay.DeviceV4)
		if (err == nil) != step.device {
			t.Errorf("%s: device %s exists: %v, want %v", step.cfg.Mode, overlay.DeviceV4, err == nil, step.device)
		}
		for _, f := range both {
			expectSeen(t, n1.pod, l.pod(2, f), l.pod(1, f))
			if step.cfg.Mode == overlay.Never {
				expectUnreachable(t, n1.pod, l.pod(3, f))
			} else {
				expectSeen(t, n1.pod, l.pod(3, f), l.pod(1, f))
			}
		}
		if got, err := whoami(c); err != nil || got != l.pod(1, nodeview.IPv4) {
			t.Errorf("%s: the connection opened under never answers %q (%v)", step.cfg.Mode, got, err)
		}
		if t.Failed() {
			t.Fatalf("after switching to %s, node1 has:\n%s", step.cfg.Mode, n1.ours(t))
		}
	}
}

func TestConnectionsSurviveARestartOfTheShell(t *testing.T) {
	l := newLab(t)
	serve(t, l.node(3).pod)
	l.sync(t, crossSubnet)
	n1 := l.node(1)
	before, _, _ := strings.Cut(n1.show(t, "ip", "-o", "link", "show", overlay.DeviceV4), ":")
	var conns []*netns.EchoConn
	for _, f := range both {
		c, err := dial(n1.pod, l.pod(3, f))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	// A restart: the old process leaves everything in place; the new one
	// has its own netlink handles and syncs from scratch.
	for _, n := range l.nodes {
		n.h = n.ns.Netlink(t)
	}
	l.sync(t, crossSubnet)
	if after, _, _ := strings.Cut(n1.show(t, "ip", "-o", "link", "show", overlay.DeviceV4), ":"); after != before {
		t.Errorf("%s had index %s before the restart and %s after: recreated", overlay.DeviceV4, before, after)
	}
	for i, c := range conns {
		if got, err := whoami(c); err != nil || got != l.pod(1, both[i]) {
			t.Errorf("%s connection opened before the restart: server saw %q (%v)", both[i], got, err)
		}
	}
}

// TestNodeChangesAreAppliedWithoutAFullSync: a Node that comes or goes is
// written by SyncChanged alone, and leaves what a full sync would leave.
func TestNodeChangesAreAppliedWithoutAFullSync(t *testing.T) {
	l := newLab(t)
	serve(t, l.node(3).pod)
	l.sync(t, crossSubnet)
	n1, want := l.node(1), l.node(1).ours(t)
	s, err := overlay.NewSyncer(n1.h, crossSubnet, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Sync("node1", l.facts()[:2]); err != nil {
		t.Fatal(err)
	}
	if got := n1.ours(t); strings.Contains(got, "20.13") {
		t.Fatalf("node3 is not among the Nodes but node1 has:\n%s", got)
	}
	// A full sync would put node2's route back: left missing, it shows
	// that SyncChanged wrote node3's entries and did not resync.
	n1.show(t, "ip", "route", "del", "10.244.2.0/24")
	if _, err := s.SyncChanged("node1", l.facts(), []string{"node3"}); err != nil {
		t.Fatal(err)
	}
	if got := n1.show(t, "ip", "route", "show", "10.244.2.0/24"); got != "" {
		t.Errorf("node3 came back and node2's deleted route was rewritten (%q): a full sync, not node3's entries alone", got)
	}
	n1.show(t, "ip", "route", "add", "10.244.2.0/24", "via", "192.168.10.12", "proto", "207")
	if got := n1.ours(t); got != want {
		t.Errorf("after node3 came back, node1 has:\n%s\nwant, as after a full sync:\n%s", got, want)
	}
	for _, f := range both {
		expectSeen(t, n1.pod, l.pod(3, f), l.pod(1, f))
	}
	if _, err := s.SyncChanged("node1", l.facts()[:2], []string{"node3"}); err != nil {
		t.Fatal(err)
	}
	if got := n1.ours(t); strings.Contains(got, "20.13") || strings.Contains(got, "244.3.") || strings.Contains(got, "fd00:b::13") {
		t.Errorf("node3 is gone but node1 still has:\n%s", got)
	}
}

// SyncChanged takes a full sync, which also heals what someone deleted,
// when many Nodes changed at once (a relist, a renumbering: as deltas they
// cost more), and when its caller took changes it did not apply (its own
// Node was missing). A route deleted behind the syncer's back shows it:
// only a full sync, which reads the kernel back, puts it back.
func TestSyncChangedTakesAFullSyncWhenItMust(t *testing.T) {
	for _, tc := range []struct {
		name    string
		forget  bool
		changed []string
	}{
		{"two of three Nodes changed", false, []string{"node2", "node3"}},
		{"changes forgotten", true, []string{"node3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLab(t)
			l.sync(t, crossSubnet)
			n1, want := l.node(1), l.node(1).ours(t)
			s, err := overlay.NewSyncer(n1.h, crossSubnet, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Sync("node1", l.facts()); err != nil {
				t.Fatal(err)
			}
			n1.show(t, "ip", "route", "del", "10.244.2.0/24")
			if tc.forget {
				overlay.Forget(s)
			}
			if _, err := s.SyncChanged("node1", l.facts(), tc.changed); err != nil {
				t.Fatal(err)
			}
			if got := n1.ours(t); got != want {
				t.Errorf("%s, and node1 has:\n%s\nwant, as after a full sync:\n%s", tc.name, got, want)
			}
		})
	}
}
