package policy

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/netplane/netplane/e2e/netns"
)

// The truth table of the two-node suite: its probes, how each is made in
// the kernel, and what the API says of it.

// probeTimeout bounds one probe: a denied connection costs this much.
const probeTimeout = 700 * time.Millisecond

// tprobe is one connection: from and to are a pod ("x/a"), "ext" (the
// host outside the cluster), a node ("node1"), or, as to, "svc" (the
// ClusterIP of x/a).
type tprobe struct {
	from, to string
	v6       bool
	proto    v1.Protocol
	port     int
}

func (p tprobe) String() string {
	fam := ""
	if p.v6 {
		fam = " IPv6"
	}
	return fmt.Sprintf("%s -> %s %s/%d%s", p.from, p.to, strings.ToLower(string(p.proto)), p.port, fam)
}

// probes is the truth table: every pod to every other pod on 80 and 81
// over TCP, UDP and SCTP (IPv4) and over TCP 80 and UDP 81 (IPv6); every
// pod to and from the outside host; each node to every pod; every pod to
// the Service.
func (c *twoNodes) probes() []tprobe {
	var out []tprobe
	keys := c.podKeys()
	for _, from := range keys {
		for _, to := range keys {
			if from == to {
				continue // a pod reaching itself never leaves it
			}
			for _, proto := range protocols {
				for _, port := range []int{80, 81} {
					out = append(out, tprobe{from, to, false, proto, port})
				}
			}
			out = append(out, tprobe{from, to, true, tcp, 80}, tprobe{from, to, true, udp, 81})
		}
		out = append(out, tprobe{from, "ext", false, tcp, 80}, tprobe{from, "ext", false, udp, 81}, tprobe{from, "ext", true, tcp, 81},
			tprobe{"ext", from, false, tcp, 80}, tprobe{"ext", from, true, udp, 81})
		for _, n := range c.Nodes {
			out = append(out, tprobe{n.Name, from, false, tcp, 81})
		}
		if from != "x/a" {
			out = append(out, tprobe{from, "svc", false, tcp, 80})
		}
	}
	return out
}

func (c *twoNodes) podKeys() []string {
	var keys []string
	for k := range c.pods {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// endpoint is the oracle's end of a probe, and the node enforcing it.
func (c *twoNodes) endpoint(name string, v6 bool) (endpoint, string) {
	if name == "svc" {
		name = "x/a" // judged on the backend
	}
	if p := c.pods[name]; p != nil {
		ip := p.IP
		if v6 {
			ip = p.IP6
		}
		return endpoint{pod: c.api.pods[types.NamespacedName{Namespace: p.obj.Namespace, Name: p.obj.Name}], ip: netip.MustParseAddr(ip)}, p.Node.Name
	}
	ip := extIP
	if v6 {
		ip = extIP6
	}
	for _, n := range c.Nodes {
		if n.Name == name {
			ip = n.IP
			if v6 {
				ip = n.IP6
			}
		}
	}
	return endpoint{ip: netip.MustParseAddr(ip)}, ""
}

// expect is what the API says of a probe: the source's egress on its
// node and the destination's ingress on its node must allow it, unless
// that node does not enforce; a node reaches its own pods always.
func (c *twoNodes) expect(p tprobe) bool {
	from, fromNode := c.endpoint(p.from, p.v6)
	to, toNode := c.endpoint(p.to, p.v6)
	if p.from == toNode {
		return true
	}
	egress := fromNode == "" || c.disabled[fromNode] ||
		c.api.directionAllows(netv1.PolicyTypeEgress, from, to, to, int32(p.port), p.proto)
	ingress := toNode == "" || c.disabled[toNode] ||
		c.api.directionAllows(netv1.PolicyTypeIngress, to, from, to, int32(p.port), p.proto)
	return egress && ingress
}

// netnsOf is where a probe starts.
func (c *twoNodes) netnsOf(name string) *netns.NS {
	if p := c.pods[name]; p != nil {
		return p.NS
	}
	for _, n := range c.Nodes {
		if n.Name == name {
			return n.NS
		}
	}
	return c.ext
}

// addrOf is a probe's destination address.
func (c *twoNodes) addrOf(p tprobe) string {
	if p.to == "svc" {
		return c.svcIP
	}
	ep, _ := c.endpoint(p.to, p.v6)
	return ep.ip.String()
}

// make makes the probes, many at once, and says which got through.
func (c *twoNodes) make(probes []tprobe) []bool {
	got := make([]bool, len(probes))
	sem := make(chan struct{}, 128)
	var wg sync.WaitGroup
	for i, p := range probes {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			got[i] = c.connect(p)
		})
	}
	wg.Wait()
	return got
}

// connect makes one probe: a TCP connection and an echo, a UDP datagram
// and its echo, or an SCTP INIT seen by the destination's raw socket.
func (c *twoNodes) connect(p tprobe) bool {
	addr := net.JoinHostPort(c.addrOf(p), fmt.Sprint(p.port))
	ns := c.netnsOf(p.from)
	network := strings.ToLower(string(p.proto)) + map[bool]string{false: "4", true: "6"}[p.v6]
	switch p.proto {
	case v1.ProtocolSCTP:
		return c.sctp.probe(ns, c.netnsOf(p.to), netip.MustParseAddrPort(addr))
	case v1.ProtocolUDP:
		var conn net.Conn
		d := net.Dialer{LocalAddr: &net.UDPAddr{Port: sourcePort()}}
		if err := ns.Do(func() (err error) { conn, err = d.Dial(network, addr); return err }); err != nil {
			return false
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(probeTimeout))
		return echoes(conn)
	}
	var conn net.Conn
	if err := ns.Do(func() (err error) { conn, err = net.DialTimeout(network, addr, probeTimeout); return err }); err != nil {
		return false
	}
	defer conn.Close()
	return echoes(conn)
}

// lastPort counts the source ports of UDP and SCTP probes.
var lastPort atomic.Int32

// sourcePort is a source port no probe of the suite used before: the
// conntrack entry of an earlier flow allowed then (UDP's lasts two
// minutes) would let a probe reusing its port pass as established.
func sourcePort() int { return 20000 + int(lastPort.Add(1))%45000 }

// sctpSeen receives SCTP INIT chunks on raw sockets in the pods (the
// kernel has no SCTP sockets): a probe's INIT carries a tag of its own,
// which the destination's receiver records.
type sctpSeen struct {
	mu   sync.Mutex
	tags map[uint32]bool
}

func newSCTPSeen() *sctpSeen { return &sctpSeen{tags: map[uint32]bool{}} }

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// sctpInit is an SCTP packet of one INIT chunk with the initiate tag tag.
func sctpInit(sport, dport uint16, tag uint32) []byte {
	b := make([]byte, 32)
	binary.BigEndian.PutUint16(b[0:], sport)
	binary.BigEndian.PutUint16(b[2:], dport)
	b[12] = 1 // INIT
	binary.BigEndian.PutUint16(b[14:], 20)
	binary.BigEndian.PutUint32(b[16:], tag)
	binary.BigEndian.PutUint32(b[20:], 65535) // receiver window
	binary.BigEndian.PutUint16(b[24:], 1)     // outbound streams
	binary.BigEndian.PutUint16(b[26:], 1)     // inbound streams
	binary.BigEndian.PutUint32(b[28:], tag)   // initial TSN
	binary.LittleEndian.PutUint32(b[8:], crc32.Checksum(b, castagnoli))
	return b
}

// listen receives SCTP in ns on both families until the test ends.
func (s *sctpSeen) listen(t *testing.T, ns *netns.NS) {
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		var fd int
		err := ns.Do(func() (err error) {
			if fd, err = unix.Socket(fam, unix.SOCK_RAW, unix.IPPROTO_SCTP); err != nil {
				return err
			}
			return unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 200000})
		})
		if err != nil {
			t.Fatalf("raw SCTP socket: %v", err)
		}
		done := make(chan struct{})
		stopped := make(chan struct{})
		t.Cleanup(func() { close(done); <-stopped; unix.Close(fd) })
		go func() {
			defer close(stopped)
			buf := make([]byte, 256)
			for {
				select {
				case <-done:
					return
				default:
				}
				n, _, err := unix.Recvfrom(fd, buf, 0)
				if err != nil {
					continue
				}
				b := buf[:n]
				if fam == unix.AF_INET && n > 20 {
					b = b[int(b[0]&0x0f)*4:] // IPv4 raw sockets see the IP header
				}
				if len(b) >= 20 && b[12] == 1 {
					s.mu.Lock()
					s.tags[binary.BigEndian.Uint32(b[16:20])] = true
					s.mu.Unlock()
				}
			}
		}()
	}
}

// probe sends an INIT from src to dst and waits for it at the receiver.
func (s *sctpSeen) probe(src, _ *netns.NS, dst netip.AddrPort) bool {
	tag := rand.Uint32() | 1
	pkt := sctpInit(uint16(sourcePort()), dst.Port(), tag)
	err := src.Do(func() error {
		fam, sa := unix.AF_INET, unix.Sockaddr(&unix.SockaddrInet4{Addr: dst.Addr().As4()})
		if dst.Addr().Is6() {
			fam, sa = unix.AF_INET6, &unix.SockaddrInet6{Addr: dst.Addr().As16()}
		}
		fd, err := unix.Socket(fam, unix.SOCK_RAW, unix.IPPROTO_SCTP)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Sendto(fd, pkt, 0, sa)
	})
	if err != nil {
		return false
	}
	deadline := time.Now().Add(probeTimeout)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		seen := s.tags[tag]
		s.mu.Unlock()
		if seen {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}

// stated is a probe whose verdict a case states outright, so a wrong
// oracle cannot agree with wrong tables.
type stated struct {
	p    tprobe
	want bool
}

func allow(from, to string, proto v1.Protocol, port int) stated {
	return stated{tprobe{from, to, false, proto, port}, true}
}

func deny(from, to string, proto v1.Protocol, port int) stated {
	return stated{tprobe{from, to, false, proto, port}, false}
}

// check waits for the nodes to program the last change (the probes whose
// verdict changed flip), then makes every probe of the truth table and
// compares each with the API reading, and the spots with the case.
func (c *twoNodes) check(t *testing.T, spots ...stated) {
	t.Helper()
	for _, s := range spots {
		if got := c.expect(s.p); got != s.want {
			t.Errorf("%s: the API reading says allowed=%v, the case %v", s.p, got, s.want)
		}
	}
	probes := c.probes()
	want := map[tprobe]bool{}
	var changed []tprobe
	for _, p := range probes {
		want[p] = c.expect(p)
		if old, ok := c.last[p]; !ok || old != want[p] {
			changed = append(changed, p)
		}
	}
	c.last = want
	c.settle(changed, want)
	got := c.make(probes)
	var retry []tprobe
	for i, p := range probes {
		if got[i] != want[p] && want[p] {
			retry = append(retry, p) // an allowed probe may lose a race with a busy machine: once more
		}
	}
	again := map[tprobe]bool{}
	for i, ok := range c.make(retry) {
		again[retry[i]] = ok
	}
	var bad []string
	for i, p := range probes {
		if ok, retried := again[p]; retried {
			got[i] = ok
		}
		if got[i] != want[p] {
			bad = append(bad, fmt.Sprintf("%s: got through=%v, want %v", p, got[i], want[p]))
		}
	}
	if len(bad) > 0 {
		t.Errorf("%d of %d probes differ from the API reading:\n  %s", len(bad), len(probes), strings.Join(bad[:min(len(bad), 25)], "\n  "))
	}
}

// settle waits until the probes that changed give their new verdict, the
// sign that both nodes programmed the change.
func (c *twoNodes) settle(changed []tprobe, want map[tprobe]bool) {
	deadline := time.Now().Add(15 * time.Second)
	for len(changed) > 0 && time.Now().Before(deadline) {
		got := c.make(changed)
		var still []tprobe
		for i, p := range changed {
			if got[i] != want[p] {
				still = append(still, p)
			}
		}
		changed = still
	}
}
