package wireguard

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/tun"
	"golang.zx2c4.com/wireguard/tun/tuntest"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

func message(typ uint32, size int, words ...uint32) []byte {
	p := make([]byte, size)
	binary.LittleEndian.PutUint32(p, typ)
	for i, w := range words {
		binary.LittleEndian.PutUint32(p[4+4*i:], w)
	}
	return p
}

func TestSessionIndicesOfMessages(t *testing.T) {
	for _, tc := range []struct {
		name             string
		p                []byte
		sender, receiver uint32
		hasS, hasR       bool
	}{
		{"initiation", message(msgInitiation, 148, 7), 7, 0, true, false},
		{"response", message(msgResponse, 92, 7, 9), 7, 9, true, true},
		{"cookie reply", message(msgCookie, 64, 9), 0, 9, false, true},
		{"data", message(msgTransport, 80, 9), 0, 9, false, true},
		{"keepalive", message(msgTransport, 32, 9), 0, 9, false, true},
		{"cut short", message(msgResponse, 10, 7), 7, 0, true, false},
		{"too short for a type", []byte{4, 0}, 0, 0, false, false},
		{"unknown type", message(5, 32, 9), 0, 0, false, false},
		{"a type in the reserved bytes", message(4|1<<8, 32, 9), 0, 0, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, okS := senderIndex(tc.p)
			r, okR := receiverIndex(tc.p)
			if s != tc.sender || okS != tc.hasS || r != tc.receiver || okR != tc.hasR {
				t.Fatalf("sender %d %v, receiver %d %v; want %d %v, %d %v", s, okS, r, okR, tc.sender, tc.hasS, tc.receiver, tc.hasR)
			}
		})
	}
}

func TestSessionsAreTheLiveOnesMadeHere(t *testing.T) {
	var s sessions
	t0 := time.Unix(1000, 0)
	s.sent([][]byte{message(msgInitiation, 148, 1), message(msgTransport, 32, 2)}, func() time.Time { return t0 })
	s.sent([][]byte{message(msgResponse, 92, 3, 4)}, func() time.Time { return t0.Add(time.Minute) })
	got := s.live(t0.Add(sessionLife + time.Second))
	if len(got) != 1 || got[0] != 3 {
		t.Fatalf("live = %v; want [3]: 1 is too old, 2 and 4 are the peers' indices", got)
	}
}

// wire is a network of UDP ports in memory: what is sent to a port no bind
// holds is lost, as the kernel's would be; what is sent to a held port
// waits until it is let through.
type wire struct {
	mu    sync.Mutex
	ports map[uint16]chan wirePacket
	held  map[uint16][]wirePacket
	lost  int
}

type wirePacket struct {
	b    []byte
	from uint16
}

func newWire() *wire {
	return &wire{ports: map[uint16]chan wirePacket{}, held: map[uint16][]wirePacket{}}
}

func (w *wire) hold(port uint16) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.held[port] = []wirePacket{}
}

func (w *wire) letThrough(port uint16) {
	w.mu.Lock()
	defer w.mu.Unlock()
	held := w.held[port]
	delete(w.held, port)
	for _, p := range held {
		w.deliverLocked(port, p)
	}
}

func (w *wire) deliverLocked(port uint16, p wirePacket) {
	if held, ok := w.held[port]; ok {
		w.held[port] = append(held, p)
		return
	}
	ch, ok := w.ports[port]
	if !ok {
		w.lost++
		return
	}
	select {
	case ch <- p:
	default:
		w.lost++
	}
}

// wireBind is one process's sockets on the wire.
type wireBind struct {
	w      *wire
	mu     sync.Mutex
	port   uint16
	ch     chan wirePacket
	closed chan struct{}
}

func endpoint(port uint16) conn.Endpoint {
	ep, err := conn.NewStdNetBind().ParseEndpoint(fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		panic(err)
	}
	return ep
}

func (b *wireBind) Open(port uint16) ([]conn.ReceiveFunc, uint16, error) {
	b.w.mu.Lock()
	defer b.w.mu.Unlock()
	if _, taken := b.w.ports[port]; taken {
		return nil, 0, syscall.EADDRINUSE
	}
	ch, closed := make(chan wirePacket, 1024), make(chan struct{})
	b.w.ports[port] = ch
	b.mu.Lock()
	b.port, b.ch, b.closed = port, ch, closed
	b.mu.Unlock()
	recv := func(bufs [][]byte, sizes []int, eps []conn.Endpoint) (int, error) {
		select {
		case p := <-ch:
			sizes[0], eps[0] = copy(bufs[0], p.b), endpoint(p.from)
			return 1, nil
		case <-closed:
			return 0, net.ErrClosed
		}
	}
	return []conn.ReceiveFunc{recv}, port, nil
}

func (b *wireBind) Close() error {
	b.w.mu.Lock()
	defer b.w.mu.Unlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed != nil {
		if b.w.ports[b.port] == b.ch {
			delete(b.w.ports, b.port)
		}
		close(b.closed)
		b.closed = nil
	}
	return nil
}

func (b *wireBind) Send(bufs [][]byte, ep conn.Endpoint) error {
	to, err := netip.ParseAddrPort(ep.DstToString())
	if err != nil {
		return err
	}
	b.mu.Lock()
	from := b.port
	b.mu.Unlock()
	b.w.mu.Lock()
	defer b.w.mu.Unlock()
	for _, p := range bufs {
		b.w.deliverLocked(to.Port(), wirePacket{b: bytes.Clone(p), from: from})
	}
	return nil
}

func (b *wireBind) SetMark(uint32) error { return nil }
func (b *wireBind) BatchSize() int       { return 1 }
func (b *wireBind) ParseEndpoint(s string) (conn.Endpoint, error) {
	return conn.NewStdNetBind().ParseEndpoint(s)
}

// sharedTUN is one TUN device opened by two processes: out is what the
// kernel routes into it (read by whichever process reads first), in what
// they write into it.
type sharedTUN struct{ out, in chan []byte }

func newSharedTUN() *sharedTUN {
	return &sharedTUN{out: make(chan []byte, 64), in: make(chan []byte, 64)}
}

// open is one process's file of the device, with its own read deadline.
func (s *sharedTUN) open() *tunFile {
	return &tunFile{s: s, deadline: make(chan struct{}), closed: make(chan struct{}), events: make(chan tun.Event)}
}

type tunFile struct {
	s                       *sharedTUN
	deadline, closed        chan struct{}
	events                  chan tun.Event
	deadlineOnce, closeOnce sync.Once
}

func (f *tunFile) File() *os.File { return nil }
func (f *tunFile) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	select {
	case p := <-f.s.out:
		sizes[0] = copy(bufs[0][offset:], p)
		return 1, nil
	case <-f.deadline:
		return 0, os.ErrDeadlineExceeded
	case <-f.closed:
		return 0, os.ErrClosed
	}
}
func (f *tunFile) Write(bufs [][]byte, offset int) (int, error) {
	for _, b := range bufs {
		f.s.in <- bytes.Clone(b[offset:])
	}
	return len(bufs), nil
}
func (f *tunFile) SetReadDeadline(time.Time) error {
	f.deadlineOnce.Do(func() { close(f.deadline) })
	return nil
}
func (f *tunFile) MTU() (int, error)        { return 1420, nil }
func (f *tunFile) Name() (string, error)    { return DeviceName, nil }
func (f *tunFile) Events() <-chan tun.Event { return f.events }
func (f *tunFile) BatchSize() int           { return 1 }
func (f *tunFile) Close() error {
	f.closeOnce.Do(func() { close(f.closed); close(f.events) })
	return nil
}

func expectPacket(t *testing.T, ch <-chan []byte, want []byte, what string) {
	t.Helper()
	select {
	case got := <-ch:
		if !bytes.Equal(got, want) {
			t.Fatalf("%s: got another packet (%d bytes) than the one sent (%d)", what, len(got), len(want))
		}
	case <-time.After(3 * time.Second):
		t.Fatalf("%s: not delivered within 3s", what)
	}
}

func configure(t *testing.T, u *UserspaceDevice, priv, peer wgtypes.Key, port int, allowed string) {
	t.Helper()
	_, n, _ := net.ParseCIDR(allowed)
	err := u.Configure(wgtypes.Config{PrivateKey: &priv, ReplacePeers: true, Peers: []wgtypes.PeerConfig{{
		PublicKey: peer, Endpoint: &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port}, AllowedIPs: []net.IPNet{*n},
	}}})
	if err != nil {
		t.Fatal(err)
	}
}

// A node whose agent is replaced (B1 by B2, one TUN device, one port) while
// its peer A still sends with B1's session: B2 passes what comes for that
// session to B1, which decrypts it, until A has taken B2's handshake. Then
// B1 closes, and B2 passes nothing on any more.
func TestAHandedOverDeviceDecryptsItsSessionsUntilPeersSwitch(t *testing.T) {
	w := newWire()
	const portA, portB = 1, 2
	devA := tuntest.NewChannelTUN()
	a, err := newUserspace("a", devA.TUN(), &wireBind{w: w}, portA, testr.NewWithOptions(t, testr.Options{Verbosity: 4}))
	if err == nil {
		err = a.up()
	}
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	devB := newSharedTUN()
	b1, err := newUserspace("b", devB.open(), &wireBind{w: w}, portB, testr.NewWithOptions(t, testr.Options{Verbosity: 4}))
	if err == nil {
		err = b1.up()
	}
	if err != nil {
		t.Fatal(err)
	}
	defer b1.Close()
	privA, pubA := key(1)
	privB, pubB := key(2)
	configure(t, a, privA, pubB, portB, "10.0.2.0/24")
	configure(t, b1, privB, pubA, portA, "10.0.1.0/24")
	ping := func(to string) []byte {
		src, dst := netip.MustParseAddr("10.0.1.1"), netip.MustParseAddr(to)
		if to[5] == '1' {
			src = netip.MustParseAddr("10.0.2.1")
		}
		return tuntest.Ping(dst, src)
	}

	p := ping("10.0.2.10")
	devA.Outbound <- p
	expectPacket(t, devB.in, p, "A to B, B1's session")

	// B2 takes the port; what is sent to A waits, so that A goes on with
	// B1's session.
	relay, err := b1.handOver()
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.FileConn(relay)
	relay.Close()
	if err != nil {
		t.Fatal(err)
	}
	b2, err := newUserspace("b", devB.open(), &wireBind{w: w}, portB, testr.NewWithOptions(t, testr.Options{Verbosity: 4}))
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	b2.awaitTake(c.(*net.UnixConn))
	w.hold(portA)
	configure(t, b2, privB, pubA, portA, "10.0.1.0/24")

	p = ping("10.0.2.11")
	devA.Outbound <- p
	expectPacket(t, devB.in, p, "A to B with B1's session after B2 took the port")
	back := ping("10.0.1.11")
	devB.out <- back
	w.letThrough(portA)
	expectPacket(t, devA.Inbound, back, "B to A, read by B2 and sent after its handshake")
	p = ping("10.0.2.12")
	devA.Outbound <- p
	expectPacket(t, devB.in, p, "A to B after B2's handshake")

	select {
	case <-b1.Released():
	case <-time.After(relayWindow + 3*time.Second):
		t.Fatal("B1 was not released after the relay window")
	}
	deadline := time.Now().Add(3 * time.Second)
	for b2.bind.prev.Load() != nil {
		if time.Now().After(deadline) {
			t.Fatal("B2 still passes packets on after B1 closed")
		}
		time.Sleep(time.Millisecond)
	}
	p = ping("10.0.2.13")
	devA.Outbound <- p
	expectPacket(t, devB.in, p, "A to B with B1 gone")
	if w.lost != 0 {
		t.Errorf("%d packets lost on the wire; want none", w.lost)
	}
}

// A new agent that takes nothing (it runs without encryption, or the
// kernel's WireGuard) closes its end of the relay: the device handed over
// stops at once, so that only one process ever reads the TUN device.
func TestAHandedOverDeviceStopsWhenNothingIsTaken(t *testing.T) {
	w := newWire()
	b1, err := newUserspace("b", newSharedTUN().open(), &wireBind{w: w}, 2, testr.New(t))
	if err == nil {
		err = b1.up()
	}
	if err != nil {
		t.Fatal(err)
	}
	defer b1.Close()
	relay, err := b1.handOver()
	if err != nil {
		t.Fatal(err)
	}
	relay.Close()
	select {
	case <-b1.Released():
	case <-time.After(3 * time.Second):
		t.Fatal("not released after the new agent hung up")
	}
	w.mu.Lock()
	_, held := w.ports[2]
	w.mu.Unlock()
	if held {
		t.Fatal("the device still holds its port")
	}
}
