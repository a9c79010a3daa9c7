// Package encryption tests netplane's WireGuard encryption between nodes
// end to end: node agents in network namespaces on two subnets behind a
// router, a real API server, a capture of the wire.
package encryption

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
	"github.com/netplane/netplane/podnet"
	"github.com/netplane/netplane/wireguard"
)

func TestMain(m *testing.M) { framework.Main(m) }

// expectReach checks TCP and UDP from every pod to every other pod, both
// families, with the pod's own address as the source the server sees.
func (c *cluster) expectReach(t *testing.T) {
	t.Helper()
	for _, a := range c.nodes {
		for _, b := range c.nodes {
			if a == b {
				continue
			}
			for _, pair := range [][2]string{{a.pod.IP, b.pod.IP}, {a.pod.IP6, b.pod.IP6}} {
				for proto, seen := range map[string]func(string) (string, error){"TCP": a.pod.NS.SeenTCP, "UDP": a.pod.NS.SeenUDP} {
					got, err := seen(at(pair[1]))
					if err != nil { // once more: a first packet may wait for a neighbour
						got, err = seen(at(pair[1]))
					}
					if err != nil || got != pair[0] {
						t.Errorf("%s from %s to %s (%s): server saw %q (%v), want %s", proto, a.pod.Name, b.pod.Name, pair[1], got, err, pair[0])
					}
				}
			}
		}
	}
}

// sendMarker sends the marker from ns to the echo server at addr.
func sendMarker(ns *netns.NS, addr string) error {
	return ns.SendPayload(addr, []byte(strings.Repeat(marker, 20)))
}

// captures are the router's captures of every node's link.
func (c *cluster) captures(t *testing.T) []*netns.Capture {
	var out []*netns.Capture
	for _, n := range c.nodes {
		out = append(out, c.Router.Capture(t, n.Link))
	}
	return out
}

// onlyWireGuard checks that the captures saw WireGuard's UDP between the
// nodes (with some, at least one packet) and nothing else of IP but ICMP between
// nodes, IPv6 neighbour discovery and IGMP, and never the marker.
func (c *cluster) onlyWireGuard(t *testing.T, caps []*netns.Capture, some bool) {
	t.Helper()
	nodes := map[string]bool{}
	for _, n := range c.nodes {
		nodes[n.IP] = true
	}
	for _, cp := range caps {
		cp.Stop()
		wg, bad := 0, 0
		for _, f := range cp.Frames() {
			p := netns.Parse(f)
			if bytes.Contains(f, []byte(marker)) {
				t.Errorf("%s: the marker crossed in clear in %s", cp.Ifname, p)
			}
			between := nodes[p.Src.String()] && nodes[p.Dst.String()]
			switch {
			case p.EtherType == netns.EtherARP:
			case p.EtherType == netns.EtherIPv6 && (p.Proto == netns.ProtoICMP6 || p.Proto == 0): // neighbour discovery, MLD
			case p.Proto == netns.ProtoICMP && between:
			case p.Proto == 2 && p.Dst.IsMulticast(): // IGMP of the router's bridge
			case p.Proto == netns.ProtoUDP && between && (p.SrcPort == wireguard.DefaultPort || p.DstPort == wireguard.DefaultPort):
				wg++
			default:
				if bad++; bad <= 5 {
					t.Errorf("%s: %s crossed the router; want only WireGuard between the nodes", cp.Ifname, p)
				}
			}
		}
		if some && wg == 0 {
			t.Errorf("%s: no WireGuard packet among %d frames", cp.Ifname, len(cp.Frames()))
		}
		t.Logf("%s: %d frames, %d of WireGuard", cp.Ifname, len(cp.Frames()), wg)
	}
}

// TestEncryptedCluster: three nodes, two subnets, --encryption=wireguard
// with the userspace implementation.
func TestEncryptedCluster(t *testing.T) {
	c := newCluster(t, 3, v1alpha1.EncryptionWireGuard)
	framework.Eventually(t, 60*time.Second, "every node's key published", func() error {
		for _, n := range c.nodes {
			if c.key(n.Name) == "" {
				return fmt.Errorf("%s has no %s", n.Name, wireguard.Annotation)
			}
		}
		return nil
	})
	t.Run("PodToPodOnlyEncryptedOnTheWire", func(t *testing.T) {
		caps := c.captures(t)
		framework.Eventually(t, 30*time.Second, "pod1 reaches pod2 through the tunnel", func() error {
			_, err := c.nodes[0].pod.NS.SeenTCP(at(c.nodes[1].pod.IP))
			return err
		})
		c.expectReach(t)
		for _, a := range c.nodes {
			for _, b := range c.nodes {
				if a != b {
					for _, ip := range []string{b.pod.IP, b.pod.IP6} {
						if err := sendMarker(a.pod.NS, at(ip)); err != nil {
							t.Errorf("marker from %s to %s: %v", a.pod.Name, ip, err)
						}
					}
				}
			}
		}
		// The node's own traffic into the tunnel leaves from its pod CIDR.
		if got, err := c.nodes[0].NS.SeenTCP(at(c.nodes[1].pod.IP)); err != nil || !strings.HasPrefix(got, "10.244.1.") {
			t.Errorf("node1 to pod2: server saw %q (%v), want an address of node1's pod CIDR", got, err)
		}
		c.onlyWireGuard(t, caps, true)
		for _, n := range c.nodes {
			// The underlay's 1500 less WireGuard's IPv4 overhead, for pods
			// and for the device.
			conf, err := os.ReadFile(filepath.Join(n.ConfDir(), podnet.ConflistName))
			if err != nil || !strings.Contains(string(conf), `"mtu": 1440`) {
				t.Errorf("%s: conflist %s (%v); want mtu 1440", n.Name, conf, err)
			}
			if l := n.NS.MustExec(t, "ip", "link", "show", wireguard.DeviceName); !strings.Contains(l, "mtu 1440") {
				t.Errorf("%s: %s; want mtu 1440", n.Name, l)
			}
			if l := n.NS.MustExec(t, "ip", "-d", "link"); strings.Contains(l, "vxlan") {
				t.Errorf("%s has a VXLAN device while encryption is on:\n%s", n.Name, l)
			}
			if v, err := n.Metric("netplane_wireguard_implementation", `implementation="userspace"`); err != nil || v != 1 {
				t.Errorf("%s: implementation metric %v, %v", n.Name, v, err)
			}
			framework.Eventually(t, 10*time.Second, n.Name+": 2 peers up in the metrics", func() error {
				if v, err := n.Metric("netplane_wireguard_peers", `state="up"`); err != nil || v != 2 {
					return fmt.Errorf("peers up %v, %v", v, err)
				}
				return nil
			})
		}
	})
	t.Run("KeylessAndUnknownPodCIDRsGetNoClearPacket", func(t *testing.T) {
		c.keyless(t)
	})
	t.Run("ServicesToABackendOnAnotherNode", func(t *testing.T) {
		c.servicesThroughTheTunnel(t)
	})
	t.Run("NetworkPolicyThroughTheTunnel", func(t *testing.T) {
		c.policyThroughTheTunnel(t)
	})
	t.Run("NodeDeletedRecreatedReaddressed", func(t *testing.T) {
		c.nodeLifecycle(t)
	})
	t.Run("AgentDownNothingInClear", func(t *testing.T) {
		// The userspace device's TUN device outlives the agent, with no
		// process reading it: what is routed into it is dropped. The guard
		// table stays too, and drops what would leave in clear by another
		// path.
		n1 := c.nodes[0]
		caps := c.captures(t)
		n1.Proc.Stop(10 * time.Second)
		if l, err := n1.NS.Exec("ip", "link", "show", wireguard.DeviceName); err != nil || !strings.Contains(l, "NO-CARRIER") {
			t.Errorf("netplane.wg with its agent down: %q, %v; want it kept, with no carrier", l, err)
		}
		for _, ip := range []string{c.nodes[1].pod.IP, c.nodes[2].pod.IP} {
			if err := sendMarker(n1.pod.NS, at(ip)); err == nil {
				t.Errorf("pod1 reached %s with node1's agent down; want it dropped", ip)
			}
		}
		c.onlyWireGuard(t, caps, false)
		c.run(n1, v1alpha1.EncryptionWireGuard)
		framework.Eventually(t, 30*time.Second, "pod1 reaches pod2 again", func() error {
			_, err := n1.pod.NS.SeenTCP(at(c.nodes[1].pod.IP))
			return err
		})
	})
	t.Run("NewAgentTakesOverWithoutAGap", func(t *testing.T) {
		c.handover(t)
	})
	t.Run("HeldConnectionAcrossRestartAndKeyRotation", func(t *testing.T) {
		c.heldAcrossRestart(t)
	})
	t.Run("SwitchOffAndOnAgain", func(t *testing.T) {
		c.switchModes(t)
	})
}

// keyless: a Node without a key, then with a malformed one, and pod
// addresses of no Node: traffic to them is dropped on the node, counted,
// warned about once, and never crosses the router.
func (c *cluster) keyless(t *testing.T) {
	caps := c.captures(t)
	ghost := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "ghost"}, Spec: v1.NodeSpec{PodCIDR: podCIDR(9), PodCIDRs: []string{podCIDR(9)}}}
	c.createNode(ghost, "192.168.2.9")
	n1 := c.nodes[0]
	event := func(reason string) func() error {
		return func() error {
			evs, err := c.API.Client.CoreV1().Events("default").List(c.Ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("involvedObject.name", "ghost").String()})
			if err != nil {
				return err
			}
			for _, e := range evs.Items {
				if e.Reason == reason && e.Type == v1.EventTypeWarning {
					return nil
				}
			}
			return fmt.Errorf("no Warning %s on ghost among %d events", reason, len(evs.Items))
		}
	}
	framework.Eventually(t, 20*time.Second, "Warning WireGuardNoKey on ghost", event("WireGuardNoKey"))
	before, _ := n1.Metric("netplane_wireguard_dropped_packets_total", `reason="no-key"`)
	for _, ip := range []string{"10.244.9.5", "10.244.200.1"} {
		if a, err := n1.pod.NS.Ask("tcp", at(ip), 300*time.Millisecond); err == nil {
			t.Errorf("TCP to %s answered %q; want it dropped", ip, a)
		}
		_ = sendMarker(n1.pod.NS, at(ip))
		_, _ = n1.NS.Ask("udp", at(ip), 100*time.Millisecond)
	}
	obj, err := c.API.Client.CoreV1().Nodes().Get(c.Ctx, "ghost", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	obj.Annotations = map[string]string{wireguard.Annotation: "not-a-key"}
	if _, err := c.API.Client.CoreV1().Nodes().Update(c.Ctx, obj, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, 20*time.Second, "Warning WireGuardBadKey on ghost", event("WireGuardBadKey"))
	if a, err := n1.pod.NS.Ask("tcp", at("10.244.9.5"), 300*time.Millisecond); err == nil {
		t.Errorf("TCP to the malformed-key node answered %q", a)
	}
	_ = sendMarker(n1.pod.NS, at("10.244.9.5"))
	c.onlyWireGuard(t, caps, false)
	framework.Eventually(t, 10*time.Second, "drops to the keyless node counted", func() error {
		after, err := n1.Metric("netplane_wireguard_dropped_packets_total", `reason="no-key"`)
		if err == nil && after <= before {
			err = fmt.Errorf("no-key drops %v, were %v", after, before)
		}
		return err
	})
	if err := c.API.Client.CoreV1().Nodes().Delete(c.Ctx, "ghost", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// heldAcrossRestart: a connection from pod1 to pod2 answers across a
// restart of node2's agent, and across a restart that rotates its key,
// which node1 follows.
func (c *cluster) heldAcrossRestart(t *testing.T) {
	n1, n2 := c.nodes[0], c.nodes[1]
	conn, err := n1.pod.NS.DialEcho(at(n2.pod.IP), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ask := func(when string) {
		start := time.Now()
		if seen, err := conn.Seen(); err != nil || seen != n1.pod.IP {
			t.Fatalf("held connection %s: saw %q, %v", when, seen, err)
		}
		t.Logf("held connection answered %s in %v", when, time.Since(start).Round(time.Millisecond))
	}
	ask("before")
	c.restart(n2, v1alpha1.EncryptionWireGuard)
	ask("after a restart of node2's agent")
	old := c.key(n2.Name)
	if err := os.Remove(n2.keyFile()); err != nil {
		t.Fatal(err)
	}
	c.restart(n2, v1alpha1.EncryptionWireGuard)
	framework.Eventually(t, 20*time.Second, "node2's new key published", func() error {
		if k := c.key(n2.Name); k == old || k == "" {
			return errors.New("still the old key")
		}
		return nil
	})
	ask("after node2 rotated its key")
	c.expectReach(t)
}

// reachV4 checks TCP from every pod to every other pod's IPv4 address,
// with the pod's own address seen, within a few seconds.
func (c *cluster) reachV4(t *testing.T, when string) {
	t.Helper()
	framework.Eventually(t, 5*time.Second, "every pod reaches every other "+when, func() error {
		for _, a := range c.nodes {
			for _, b := range c.nodes {
				if a == b {
					continue
				}
				if got, err := a.pod.NS.SeenTCP(at(b.pod.IP)); err != nil || got != a.pod.IP {
					return fmt.Errorf("%s to %s: %q, %v", a.pod.Name, b.pod.Name, got, err)
				}
			}
		}
		return nil
	})
}

// switchModes rolls encryption out of the running cluster and back in,
// one node at a time as a DaemonSet's rolling update does, through the
// permissive mode (the README's procedure): every pod reaches every other
// after each node's restart. Off, the device, its routing table and the
// guard table are gone and the overlay carries the traffic; on again,
// only WireGuard crosses the router.
//
// Throughout, a connection from outside to node1's NodePort, whose one
// backend is node2's pod, is held and asked every few milliseconds: it is
// masqueraded into whichever tunnel device carries node1's path to node2
// and must outlive every move between them.
func (c *cluster) switchModes(t *testing.T) {
	permissive := []string{"--wireguard-permissive"}
	held := c.heldNodePort(t)
	steps := []struct {
		mode  string
		extra []string
	}{
		{v1alpha1.EncryptionWireGuard, permissive},
		{v1alpha1.EncryptionNone, nil},
		{v1alpha1.EncryptionWireGuard, permissive},
		{v1alpha1.EncryptionWireGuard, nil},
	}
	for i, st := range steps {
		for _, n := range c.nodes {
			c.restart(n, st.mode, st.extra...)
			when := fmt.Sprintf("after %s restarted with --encryption=%s %v", n.Name, st.mode, st.extra)
			c.reachV4(t, when)
			if err := held.now().heldErr; err != nil {
				t.Fatalf("the held NodePort connection %s: %v", when, err)
			}
		}
		if i == 0 {
			c.permissiveRoutesOnlyAfterAHandshake(t)
		}
		if st.mode != v1alpha1.EncryptionNone {
			continue
		}
		for _, n := range c.nodes {
			framework.Eventually(t, 20*time.Second, n.Name+" without netplane.wg, its rules nor the guard table", func() error {
				if _, err := n.NS.Exec("ip", "link", "show", wireguard.DeviceName); err == nil {
					return errors.New("netplane.wg still there")
				}
				if out, _ := n.NS.Exec("ip", "rule"); strings.Contains(out, "lookup 208") {
					return errors.New("rule still there")
				}
				if out, _ := n.NS.Exec("nft", "list", "tables"); strings.Contains(out, wireguard.GuardTable.Name) {
					return errors.New("guard table still there")
				}
				if c.key(n.Name) != "" {
					return errors.New("key annotation still there")
				}
				return nil
			})
		}
	}
	t.Logf("through the switches: %v", held.stop())
	caps := c.captures(t)
	for _, n := range c.nodes {
		if out, _ := n.NS.Exec("ip", "-d", "link"); strings.Contains(out, "vxlan") {
			t.Errorf("%s still has a VXLAN device", n.Name)
		}
	}
	c.expectReach(t)
	c.onlyWireGuard(t, caps, true)
}

// permissiveRoutesOnlyAfterAHandshake: in permissive mode a peer that has
// never answered a handshake (here a Node with a key and no agent: as a
// peer that has not yet seen this node's new key) is sent to in clear, by
// the main table, not into the device where it would be lost; the peers
// that did answer are routed into the device.
func (c *cluster) permissiveRoutesOnlyAfterAHandshake(t *testing.T) {
	k, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	silent := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "silent", Annotations: map[string]string{wireguard.Annotation: k.PublicKey().String()}},
		Spec: v1.NodeSpec{PodCIDR: podCIDR(9), PodCIDRs: []string{podCIDR(9)}}}
	c.createNode(silent, "192.168.2.9")
	defer func() {
		if err := c.API.Client.CoreV1().Nodes().Delete(c.Ctx, "silent", metav1.DeleteOptions{}); err != nil {
			t.Error(err)
		}
	}()
	for _, n := range c.nodes {
		framework.Eventually(t, 20*time.Second, n.Name+" telling that silent waits for a handshake", func() error {
			if log, _ := os.ReadFile(n.Proc.Log); !strings.Contains(string(log), `["silent"]`) {
				return errors.New("not yet")
			}
			return nil
		})
		framework.Eventually(t, 20*time.Second, n.Name+" routing the other nodes' pods into the device", func() error {
			table := n.NS.MustExec(t, "ip", "route", "show", "table", "208")
			for i, o := range c.nodes {
				if o != n && !strings.Contains(table, podCIDR(i+1)) {
					return fmt.Errorf("no route to %s's pods:\n%s", o.Name, table)
				}
			}
			return nil
		})
		if table := n.NS.MustExec(t, "ip", "route", "show", "table", "208"); strings.Contains(table, podCIDR(9)) {
			t.Errorf("%s routes silent's pods into the device before any handshake with it:\n%s", n.Name, table)
		}
	}
}

// nodeLifecycle: node3's Node deleted (its pod unreachable from pod1, and
// nothing of it on the wire), re-created (its agent publishes its key
// again and the peers take it back), and re-addressed (moved to another
// address of its subnet: the peers follow the new endpoint).
func (c *cluster) nodeLifecycle(t *testing.T) {
	n1, n3 := c.nodes[0], c.nodes[2]
	nodes := c.API.Client.CoreV1().Nodes()
	obj, err := nodes.Get(c.Ctx, n3.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	caps := c.captures(t)
	if err := nodes.Delete(c.Ctx, n3.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, 10*time.Second, "pod1 cut off from the deleted node's pod", func() error {
		if _, err := n1.pod.NS.Ask("tcp", at(n3.pod.IP), 300*time.Millisecond); err == nil {
			return errors.New("pod3 still answers")
		}
		return nil
	})
	_ = sendMarker(n1.pod.NS, at(n3.pod.IP))
	c.onlyWireGuard(t, caps, false)
	fresh := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: n3.Name}, Spec: v1.NodeSpec{PodCIDR: obj.Spec.PodCIDR, PodCIDRs: obj.Spec.PodCIDRs}}
	c.createNode(fresh, n3.IP)
	start := time.Now()
	framework.Eventually(t, 20*time.Second, "pod1 reaches the re-created node's pod", func() error {
		got, err := n1.pod.NS.SeenTCP(at(n3.pod.IP))
		if err == nil && got != n1.pod.IP {
			err = fmt.Errorf("seen %q", got)
		}
		return err
	})
	t.Logf("re-created node reached after %v", time.Since(start).Round(time.Millisecond))
	// Re-addressed: node3 moves from .3 to .4 on its subnet.
	// The old address first: deleting a primary address takes its
	// secondaries with it.
	n3.NS.MustExec(t, "ip", "addr", "del", n3.IP+"/24", "dev", "eth0")
	n3.NS.MustExec(t, "ip", "addr", "add", "192.168.1.4/24", "dev", "eth0")
	n3.NS.Route(t, "default", "via", "192.168.1.1")
	n3.IP = "192.168.1.4"
	cur, err := nodes.Get(c.Ctx, n3.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Status.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: n3.IP}}
	if _, err := nodes.UpdateStatus(c.Ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// From node1 first, within 5 s: node3 would tell node1 its new address
	// itself, as WireGuard roams, once it sends (seen 14 s after the move
	// with node1 keeping the old endpoint); only node1's agent following
	// the Node's new InternalIP makes it sooner.
	start = time.Now()
	framework.Eventually(t, 5*time.Second, "pod1 reaches node3's pod at its new address", func() error {
		if got, err := n1.pod.NS.SeenTCP(at(n3.pod.IP)); err != nil || got != n1.pod.IP {
			return fmt.Errorf("%q, %v", got, err)
		}
		return nil
	})
	t.Logf("re-addressed node reached from node1 after %v", time.Since(start).Round(time.Millisecond))
	framework.Eventually(t, 20*time.Second, "pods reach each other with node3 re-addressed", func() error {
		for _, pair := range [][2]*pod{{n1.pod, n3.pod}, {n3.pod, n1.pod}, {c.nodes[1].pod, n3.pod}} {
			if got, err := pair[0].NS.SeenTCP(at(pair[1].IP)); err != nil || got != pair[0].IP {
				return fmt.Errorf("%s to %s: %q, %v", pair[0].Name, pair[1].Name, got, err)
			}
		}
		return nil
	})
}
