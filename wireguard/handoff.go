package wireguard

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/tun"
)

// Handing a running userspace device to the next agent (internal/handover)
// without losing what peers send meanwhile. The UDP sockets go to the
// next agent and never close (portbind.go); wireguard-go cannot hand its
// session keys over, so the predecessor's wireguard-go goes on decrypting
// what peers still send with its sessions until they have taken the
// successor's handshake, over a relay (a socket pair) whose one end goes
// with the TUN device's file:
//
//	successor                            predecessor (its device running)
//	claim (agent socket)          ─────▶
//	                              ◀─────  the TUN file, one end of the relay
//	its device made, down, the TUN unread, until its first configuration
//	(key, peers); then "take"     ─────▶  stops reading the TUN
//	                              ◀─────  "taken": the indices of its
//	                                      sessions, its UDP sockets
//	                                      it stops reading the sockets
//	                              ◀─────  "closed"
//	up on those sockets, a handshake with every peer, reads the TUN
//	a packet to one of those      ─────▶  decrypted, into the TUN
//	                              ◀─────  a data packet it still sends
//
// until the predecessor's device closes, relayWindow after the take.
// Between "closed" and the successor's first read, what peers send waits
// in the sockets' receive buffers.

// relayWindow is how long a predecessor decrypts its sessions after the
// take: a peer takes the successor's handshake within a round trip, and
// retries a lost one after 5 s (REKEY_TIMEOUT) — past that, its packets
// are lost either way.
const relayWindow = 1500 * time.Millisecond

// WireGuard's message types (its first four bytes, little endian).
const (
	msgInitiation = 1
	msgResponse   = 2
	msgCookie     = 3
	msgTransport  = 4
)

func msgType(p []byte) uint32 {
	if len(p) < 4 {
		return 0
	}
	return binary.LittleEndian.Uint32(p)
}

// senderIndex is the index a handshake message names its sender's session
// by: what peers then address that session with.
func senderIndex(p []byte) (uint32, bool) {
	switch t := msgType(p); {
	case (t == msgInitiation || t == msgResponse) && len(p) >= 8:
		return binary.LittleEndian.Uint32(p[4:]), true
	}
	return 0, false
}

// receiverIndex is the session a message is addressed to; none for an
// initiation, which starts one.
func receiverIndex(p []byte) (uint32, bool) {
	switch t := msgType(p); {
	case t == msgResponse && len(p) >= 12:
		return binary.LittleEndian.Uint32(p[8:]), true
	case (t == msgCookie || t == msgTransport) && len(p) >= 8:
		return binary.LittleEndian.Uint32(p[4:]), true
	}
	return 0, false
}

// sessions are the indices a device gave its sessions, learnt from the
// handshake messages it sends.
type sessions struct {
	mu    sync.Mutex
	made  map[uint32]time.Time
	prune int // len(made) at which the old ones are dropped
}

// sessionLife is how long a session may be used: REJECT_AFTER_TIME.
const sessionLife = 180 * time.Second

// sent learns from what is sent: bufs, at now (read only for a
// handshake message, which is rare).
func (s *sessions) sent(bufs [][]byte, now func() time.Time) {
	for _, b := range bufs {
		i, ok := senderIndex(b)
		if !ok {
			continue
		}
		s.mu.Lock()
		if s.made == nil {
			s.made, s.prune = map[uint32]time.Time{}, 64
		}
		at := now()
		s.made[i] = at
		if len(s.made) >= s.prune {
			for i, t := range s.made {
				if at.Sub(t) > sessionLife {
					delete(s.made, i)
				}
			}
			s.prune = max(64, 2*len(s.made))
		}
		s.mu.Unlock()
	}
}

// live are the indices of the sessions that may still be used at now,
// the newest maxSessions.
func (s *sessions) live(now time.Time) []uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []uint32
	for i, at := range s.made {
		if now.Sub(at) <= sessionLife {
			out = append(out, i)
		}
	}
	if len(out) > maxSessions {
		slices.SortFunc(out, func(a, b uint32) int { return s.made[b].Compare(s.made[a]) })
		out = out[:maxSessions]
	}
	return out
}

// The relay's messages: a kind, then for packets the endpoint (its length,
// its text) and the packet.
const (
	relayTake     = 't' // successor: stop reading the TUN, let go of the port
	relayTaken    = 'i' // predecessor: its session indices follow, its sockets come with them
	relayClosed   = 'c' // predecessor: it no longer reads the sockets, since (unix nanoseconds)
	relayReceived = 'r' // successor: a packet that came for one of those
	relaySend     = 's' // predecessor: a data packet to send
)

// maxMessage bounds a relay message: a packet with its header, or the
// session indices (at most maxSessions of them, the newest).
const (
	maxMessage  = 1 << 17
	maxSessions = (maxMessage - 1) / 4
)

func relayPacket(kind byte, ep conn.Endpoint, p []byte) []byte {
	addr := ep.DstToString()
	out := make([]byte, 0, 2+len(addr)+len(p))
	out = append(out, kind, byte(len(addr)))
	out = append(out, addr...)
	return append(out, p...)
}

func parseRelayed(m []byte) (kind byte, addr string, p []byte, err error) {
	if len(m) < 2 || len(m) < 2+int(m[1]) {
		return 0, "", nil, fmt.Errorf("relay message of %d bytes is cut short", len(m))
	}
	n := 2 + int(m[1])
	return m[0], string(m[2:n]), m[n:], nil
}

// handoffBind is wireguard-go's sockets (conn.Bind) with what a handover
// needs: it learns its sessions' indices from what it sends; as a
// successor, it passes what comes for its predecessor's sessions over the
// relay; as a predecessor that was taken over, it receives from the relay
// and sends its data packets there.
type handoffBind struct {
	conn.Bind
	made sessions
	prev atomic.Pointer[predecessor] // successor: while the predecessor decrypts

	mu        sync.Mutex
	relay     *net.UnixConn // predecessor, taken over: its only way in and out
	relayOpen bool          // Open gave out the relay's receive
	boundAt   time.Time     // when the sockets were last opened
}

// predecessor is the agent a successor took over from, while it decrypts
// its sessions.
type predecessor struct {
	relay   *net.UnixConn
	indices map[uint32]struct{}
	closed  chan time.Time // when it stopped reading its sockets
	mu      sync.Mutex     // writes on relay
}

// forward passes b on; a predecessor too slow to take it does not hold up
// this device's receive for longer than a few milliseconds.
func (p *predecessor) forward(b []byte, ep conn.Endpoint) {
	p.mu.Lock()
	defer p.mu.Unlock()
	_ = p.relay.SetWriteDeadline(time.Now().Add(5 * time.Millisecond))
	_, _ = p.relay.Write(relayPacket(relayReceived, ep, b))
}

func newHandoffBind(inner conn.Bind) *handoffBind { return &handoffBind{Bind: inner} }

// takenOver is the relay once the device was taken over.
func (b *handoffBind) takenOver() *net.UnixConn {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.relay
}

func (b *handoffBind) Open(port uint16) ([]conn.ReceiveFunc, uint16, error) {
	b.mu.Lock()
	if r := b.relay; r != nil {
		b.relayOpen = true
		b.mu.Unlock()
		return []conn.ReceiveFunc{b.fromRelay(r)}, port, nil
	}
	b.mu.Unlock()
	fns, actual, err := b.Bind.Open(port)
	if err == nil {
		b.mu.Lock()
		b.boundAt = time.Now()
		b.mu.Unlock()
	}
	for i, fn := range fns {
		fns[i] = b.passOn(fn)
	}
	return fns, actual, err
}

func (b *handoffBind) Close() error {
	b.mu.Lock()
	if b.relayOpen {
		b.relayOpen = false
		b.relay.Close()
	}
	b.mu.Unlock()
	return b.Bind.Close()
}

// passable sockets can go to the next agent (portBind's).
type passable interface {
	files() ([]*os.File, error)
	adopt(files []*os.File)
}

// handOver answers the successor's take on relay with the indices of the
// sessions made here and the sockets, and makes the next Close of the
// sockets the last here: from then on the relay is the way in and out.
// Call portClosed after it.
func (b *handoffBind) handOver(relay *net.UnixConn, indices []uint32) error {
	m := make([]byte, 1, 1+4*len(indices))
	m[0] = relayTaken
	for _, i := range indices {
		m = binary.LittleEndian.AppendUint32(m, i)
	}
	var rights []byte
	if p, ok := b.Bind.(passable); ok {
		files, err := p.files()
		if err != nil {
			return err
		}
		defer closeFiles(files)
		fds := make([]int, len(files))
		for i, f := range files {
			// Not Fd: it would make the socket, shared with this
			// bind's, blocking.
			rc, err := f.SyscallConn()
			if err != nil {
				return err
			}
			if err := rc.Control(func(fd uintptr) { fds[i] = int(fd) }); err != nil {
				return err
			}
		}
		rights = unix.UnixRights(fds...)
	}
	if _, _, err := relay.WriteMsgUnix(m, rights, nil); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.relay = relay
	return nil
}

// portClosed tells the successor the sockets are closed, and when.
func portClosed(relay *net.UnixConn, at time.Time) error {
	_, err := relay.Write(binary.LittleEndian.AppendUint64([]byte{relayClosed}, uint64(at.UnixNano())))
	return err
}

// Send learns the sessions' indices; taken over, only data packets go on,
// through the successor's port (a handshake there would take peers back
// from the successor).
func (b *handoffBind) Send(bufs [][]byte, ep conn.Endpoint) error {
	b.made.sent(bufs, time.Now)
	r := b.takenOver()
	if r == nil {
		return b.Bind.Send(bufs, ep)
	}
	for _, p := range bufs {
		if msgType(p) == msgTransport {
			if _, err := r.Write(relayPacket(relaySend, ep, p)); err != nil {
				return err
			}
		}
	}
	return nil
}

// passOn wraps a socket's receive: what comes for the predecessor's
// sessions goes over the relay, the rest to this device.
func (b *handoffBind) passOn(fn conn.ReceiveFunc) conn.ReceiveFunc {
	return func(bufs [][]byte, sizes []int, eps []conn.Endpoint) (int, error) {
		for {
			n, err := fn(bufs, sizes, eps)
			prev := b.prev.Load()
			if prev == nil || err != nil || n == 0 {
				return n, err
			}
			kept := 0
			for i := range n {
				p := bufs[i][:sizes[i]]
				if idx, ok := receiverIndex(p); ok {
					if _, theirs := prev.indices[idx]; theirs {
						prev.forward(p, eps[i])
						continue
					}
				}
				if kept != i {
					// wireguard-go reads the packets from its own arrays
					// behind bufs, so the bytes move, not the slices.
					sizes[kept] = copy(bufs[kept][:cap(bufs[kept])], p)
					eps[kept] = eps[i]
				}
				kept++
			}
			if kept > 0 {
				return kept, nil
			}
		}
	}
}

// fromRelay is a taken-over device's receive: the packets the successor
// passes on, one at a time.
func (b *handoffBind) fromRelay(r *net.UnixConn) conn.ReceiveFunc {
	m := make([]byte, maxMessage)
	return func(bufs [][]byte, sizes []int, eps []conn.Endpoint) (int, error) {
		for {
			n, err := r.Read(m)
			if err != nil || n == 0 {
				return 0, net.ErrClosed
			}
			kind, addr, p, err := parseRelayed(m[:n])
			if err != nil || kind != relayReceived {
				continue
			}
			ep, err := b.ParseEndpoint(addr)
			if err != nil {
				continue
			}
			sizes[0], eps[0] = copy(bufs[0], p), ep
			return 1, nil
		}
	}
}

// sendFor sends what the predecessor still sends, through this bind's
// port, until the relay closes; then nothing is passed on any more.
func (b *handoffBind) sendFor(prev *predecessor) {
	defer b.prev.CompareAndSwap(prev, nil)
	defer prev.relay.Close()
	m := make([]byte, maxMessage)
	for {
		n, err := prev.relay.Read(m)
		if err != nil || n == 0 {
			return
		}
		if m[0] == relayClosed && n == 9 {
			select {
			case prev.closed <- time.Unix(0, int64(binary.LittleEndian.Uint64(m[1:]))):
			default:
			}
			continue
		}
		kind, addr, p, err := parseRelayed(m[:n])
		if err != nil || kind != relaySend {
			continue
		}
		if ep, err := b.ParseEndpoint(addr); err == nil {
			_ = b.Bind.Send([][]byte{p}, ep)
		}
	}
}

// take asks the predecessor on relay to let go, and from its answer
// passes on what comes for its sessions; it returns once the
// predecessor no longer reads its sockets, now this bind's to open, and
// since when.
func (b *handoffBind) take(relay *net.UnixConn) (time.Time, error) {
	_ = relay.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := relay.Write([]byte{relayTake}); err != nil {
		return time.Time{}, err
	}
	m, oob := make([]byte, maxMessage), make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, err := relay.ReadMsgUnix(m, oob)
	if err != nil {
		return time.Time{}, err
	}
	if files := passedFiles(oob[:oobn]); len(files) > 0 {
		if p, ok := b.Bind.(passable); ok {
			p.adopt(files)
		} else {
			closeFiles(files)
		}
	}
	if n < 1 || m[0] != relayTaken || (n-1)%4 != 0 {
		return time.Time{}, fmt.Errorf("the running agent answered %d bytes (%q) to take its WireGuard device", n, m[:min(n, 1)])
	}
	_ = relay.SetDeadline(time.Time{})
	prev := &predecessor{relay: relay, indices: map[uint32]struct{}{}, closed: make(chan time.Time, 1)}
	for i := 1; i < n; i += 4 {
		prev.indices[binary.LittleEndian.Uint32(m[i:])] = struct{}{}
	}
	b.prev.Store(prev)
	go b.sendFor(prev)
	select {
	case at := <-prev.closed:
		return at, nil
	case <-time.After(2 * time.Second):
		return time.Time{}, fmt.Errorf("the running agent did not let go of its WireGuard port within 2s")
	}
}

// passedFiles are the files of a relay message's control message.
func passedFiles(oob []byte) []*os.File {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var out []*os.File
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			unix.CloseOnExec(fd)
			out = append(out, os.NewFile(uintptr(fd), "wireguard-port"))
		}
	}
	return out
}

// bound is when the sockets were last opened.
func (b *handoffBind) bound() time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.boundAt
}

// gatedTUN is the TUN device as a handover needs it: a successor reads it
// only once it took the port, and does not go up on the device's "up"
// event before (its port is the predecessor's still); a predecessor stops
// reading it at the take (what it read last still goes out, through the
// relay).
type gatedTUN struct {
	tun.Device
	events  chan tun.Event
	open    chan struct{} // reads may start
	stopped chan struct{} // reads have ended for good
	closed  chan struct{}
	once    sync.Once
	stop    sync.Once
	end     sync.Once
}

func newGatedTUN(t tun.Device, open bool) *gatedTUN {
	g := &gatedTUN{Device: t, events: make(chan tun.Event, 4), open: make(chan struct{}), stopped: make(chan struct{}), closed: make(chan struct{})}
	if open {
		close(g.open)
	}
	go g.relayEvents()
	return g
}

func (g *gatedTUN) Events() <-chan tun.Event { return g.events }

func (g *gatedTUN) relayEvents() {
	defer close(g.events)
	for e := range g.Device.Events() {
		select {
		case <-g.open:
		default:
			e &^= tun.EventUp
		}
		if e != 0 {
			g.events <- e
		}
	}
}

func (g *gatedTUN) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	select {
	case <-g.open:
	case <-g.closed:
		return 0, os.ErrClosed
	}
	select {
	case <-g.stopped:
		<-g.closed
		return 0, os.ErrClosed
	default:
	}
	n, err := g.Device.Read(bufs, sizes, offset)
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		<-g.closed // stopped: the device's read loop ends with it
		return 0, os.ErrClosed
	}
	return n, err
}

// start lets reads begin.
func (g *gatedTUN) start() { g.once.Do(func() { close(g.open) }) }

// halt ends reading: a read under way returns at once.
func (g *gatedTUN) halt() {
	g.stop.Do(func() {
		close(g.stopped)
		if d, ok := g.Device.(interface{ SetReadDeadline(time.Time) error }); ok {
			_ = d.SetReadDeadline(time.Now())
		} else if f := g.Device.File(); f != nil {
			_ = f.SetReadDeadline(time.Now())
		}
	})
}

func (g *gatedTUN) Close() error {
	err := error(nil)
	g.end.Do(func() {
		close(g.closed)
		err = g.Device.Close()
	})
	return err
}
