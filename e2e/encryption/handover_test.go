package encryption

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/wireguard"
)

// handover: a second agent started on node2 beside the running one, as a
// DaemonSet's surge does, takes the node over through the agent socket.
// The running agent carries node2's WireGuard traffic until the new one
// has synced; the TUN device is the same one throughout (persistent, not
// made again) and, its file handed over, drops nothing routed into it
// while it changes hands; no new connection fails and a held one never waits long;
// the old agent idles once it has let go, ready and healthy (its ports are
// the new agent's too), and stops at once when told. What peers send with
// the old agent's sessions is decrypted by it until they have taken the
// new agent's handshake: pings every 2 ms both ways lose at most what
// reaches the port in the millisecond or two it has no owner.
func (c *cluster) handover(t *testing.T) {
	n1, n2 := c.nodes[0], c.nodes[1]
	index := func() string {
		l := n2.NS.MustExec(t, "ip", "-o", "link", "show", wireguard.DeviceName)
		return strings.SplitN(l, ":", 2)[0]
	}
	before := index()
	conn, err := n1.pod.NS.DialEcho(at(n2.pod.IP), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	traffic := startTraffic(n1.pod.NS, conn, at(n2.pod.IP))

	// pod2 sends into the device every 2 ms: none of it may be dropped
	// for want of a reader while the device changes hands.
	dropped := func() uint64 {
		l, err := n2.NS.Netlink(t).LinkByName(wireguard.DeviceName)
		if err != nil {
			t.Fatal(err)
		}
		return l.Attrs().Statistics.TxDropped
	}
	droppedBefore := dropped()
	ping := n2.pod.NS.Start(t, "ping", "-q", "-i", "0.002", "-w", "60", n1.pod.IP)
	defer ping.Stop(time.Second)
	// And pod1 pings pod2: each request reaches node2 with whichever
	// session node1 has.
	pingIn := n1.pod.NS.Start(t, "ping", "-q", "-i", "0.002", "-w", "60", n2.pod.IP)
	defer pingIn.Stop(time.Second)

	old := n2.Proc
	health, _ := framework.ServedAddresses(t, old, 10*time.Second)
	c.run(n2, v1alpha1.EncryptionWireGuard) // beside it: n2.Proc is the new one
	framework.Eventually(t, 30*time.Second, "the old agent handed node2 over", func() error {
		if log, _ := os.ReadFile(old.Log); !strings.Contains(string(log), "handed the node over to the new agent") {
			return fmt.Errorf("not yet:\n%s", old.Tail(5))
		}
		return nil
	})
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DialContext: func(_ context.Context, network, addr string) (net.Conn, error) { return n2.NS.Dial(network, addr) }}}
	if code, body, err := framework.HTTPGet(client, "http://"+health+"/readyz"); err != nil || code != http.StatusOK {
		t.Errorf("old agent's /readyz: %d %q %v; want 200: it answers the new agent's probes on a shared port", code, body, err)
	}
	if code, _, err := framework.HTTPGet(client, "http://"+health+"/healthz"); err != nil || code != http.StatusOK {
		t.Errorf("old agent's /healthz: %d %v; want 200 while it idles", code, err)
	}
	if old.Exited() {
		t.Errorf("the old agent exited on its own after handing over:\n%s", old.Tail(10))
	}
	framework.Eventually(t, 30*time.Second, "the new agent took node2 over", func() error {
		if log, _ := os.ReadFile(n2.Proc.Log); !strings.Contains(string(log), "took the node over") {
			return fmt.Errorf("not yet:\n%s", n2.Proc.Tail(5))
		}
		return nil
	})
	// A second of traffic through the new agent's device.
	time.Sleep(time.Second)
	start := time.Now()
	old.Stop(10 * time.Second)
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("the old agent took %v to stop after handing over; want at once", d)
	}
	time.Sleep(500 * time.Millisecond)
	tally := traffic.stop()
	t.Logf("across the handover: %s", tally)
	for _, p := range []*framework.Process{old, n2.Proc} {
		log, _ := os.ReadFile(p.Log)
		for _, l := range strings.Split(string(log), "\n") {
			if strings.Contains(l, "handover.go") || strings.Contains(l, "WireGuard device up") || strings.Contains(l, "took the node") || strings.Contains(l, "WireGuard port") {
				t.Log(l)
			}
		}
	}
	lostBoth := 0
	for _, p := range []struct {
		what string
		ping *framework.Process
	}{{"pod2 to pod1 (replies into node2)", ping}, {"pod1 to pod2 (requests into node2)", pingIn}} {
		sent, lost := pingLoss(t, p.ping)
		t.Logf("ping %s every 2 ms across the handover: %d sent, %d lost", p.what, sent, lost)
		lostBoth += lost
	}
	if lostBoth > 2 {
		t.Errorf("pings lost %d across the handover; want at most 2 (the port's change of owner): the rest came with the old agent's sessions, which it decrypts until peers switch", lostBoth)
	}
	if d := dropped() - droppedBefore; d > 0 {
		t.Errorf("the device dropped %d packets routed into it across the handover; want none (its file is handed over, so they wait for the new agent)", d)
	}
	if after := index(); after != before {
		t.Errorf("netplane.wg is a new device (index %s, was %s); want the same one kept", after, before)
	}
	if tally.failed > 0 || tally.heldErr != nil || tally.longest > 500*time.Millisecond {
		t.Errorf("traffic lost across the handover: %s", tally)
	}
	if _, err := n1.pod.NS.SeenTCP(at(n2.pod.IP)); err != nil {
		t.Errorf("pod1 to pod2 after the old agent stopped: %v", err)
	}
}

// pingLoss interrupts ping, which then prints what it sent and received.
func pingLoss(t *testing.T, p *framework.Process) (sent, lost int) {
	t.Helper()
	_ = p.Cmd.Process.Signal(os.Interrupt)
	if _, ok := p.Wait(5 * time.Second); !ok {
		t.Fatalf("ping did not end on SIGINT:\n%s", p.Tail(5))
	}
	log, _ := os.ReadFile(p.Log)
	m := regexp.MustCompile(`(\d+) packets transmitted, (\d+) received`).FindStringSubmatch(string(log))
	if m == nil {
		t.Fatalf("no summary from ping:\n%s", p.Tail(5))
	}
	sent, _ = strconv.Atoi(m[1])
	received, _ := strconv.Atoi(m[2])
	return sent, sent - received
}

// traffic is a held connection asked every 5 ms and a new connection
// every 20 ms, until stop.
type traffic struct {
	stopc chan struct{}
	once  sync.Once
	held  io.Closer // closed by stop when set
	wg    sync.WaitGroup
	mu    sync.Mutex
	t     tally
}

type tally struct {
	dials, failed, asked int
	heldErr              error
	longest              time.Duration // between two answers on the held connection
}

func (t tally) String() string {
	return fmt.Sprintf("%d new connections, %d failed; held connection asked %d times, longest wait %v, error %v",
		t.dials, t.failed, t.asked, t.longest.Round(time.Millisecond), t.heldErr)
}

func startTraffic(from interface {
	SeenTCP(string) (string, error)
}, conn interface{ Seen() (string, error) }, addr string) *traffic {
	tr := &traffic{stopc: make(chan struct{})}
	tr.wg.Add(2)
	go func() {
		defer tr.wg.Done()
		last := time.Now()
		for {
			select {
			case <-tr.stopc:
				return
			case <-time.After(5 * time.Millisecond):
			}
			_, err := conn.Seen()
			now := time.Now()
			tr.mu.Lock()
			tr.t.asked++
			if err != nil && tr.t.heldErr == nil {
				tr.t.heldErr = err
			}
			tr.t.longest = max(tr.t.longest, now.Sub(last))
			tr.mu.Unlock()
			last = now
		}
	}()
	go func() {
		defer tr.wg.Done()
		for {
			select {
			case <-tr.stopc:
				return
			case <-time.After(20 * time.Millisecond):
			}
			_, err := from.SeenTCP(addr)
			tr.mu.Lock()
			tr.t.dials++
			if err != nil {
				tr.t.failed++
			}
			tr.mu.Unlock()
		}
	}()
	return tr
}

// now is the tally so far.
func (tr *traffic) now() tally {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.t
}

func (tr *traffic) stop() tally {
	tr.once.Do(func() { close(tr.stopc) })
	tr.wg.Wait()
	if tr.held != nil {
		_ = tr.held.Close()
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.t
}
