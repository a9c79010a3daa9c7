package dns

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"runtime"
	"time"
	"unsafe"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// udpSocket serves one UDP socket. One goroutine reads it and answers
// from the packed-answer cache itself (wire.go); a query the cache cannot
// answer goes to an idle worker of the socket, or to a goroutine of its
// own when none is idle, so an upstream that is slow to answer never
// holds the socket. Serving in the reading goroutine matters: a goroutine
// per query, as miekg/dns's server starts, spent a quarter of one core's
// time growing new goroutines' stacks under the benchmark's load.
type udpSocket struct {
	h    *Handler
	conn *net.UDPConn
	// wild is set for a socket bound to an unspecified address: its replies
	// must leave from the address each query was sent to, which the kernel
	// reports with every datagram (IP_PKTINFO, IPV6_PKTINFO).
	wild   bool
	misses chan udpQuery
}

// udpWorkers is how many goroutines per socket wait for queries the
// cache cannot answer.
const udpWorkers = 4

// udpQuery is a datagram for the full path.
type udpQuery struct {
	pkt  []byte
	from netip.AddrPort
	ctl  []byte // the reply's source address, for a wild socket
}

func newUDPSocket(h *Handler, conn *net.UDPConn) *udpSocket {
	u := &udpSocket{h: h, conn: conn, misses: make(chan udpQuery)}
	if a, ok := conn.LocalAddr().(*net.UDPAddr); ok && a.IP.IsUnspecified() {
		u.wild = true
		// As miekg/dns does: either family's option may fail on a socket of
		// the other, and an IPv6 socket takes both.
		fd, err := conn.SyscallConn()
		if err == nil {
			_ = fd.Control(func(s uintptr) {
				_ = unix.SetsockoptInt(int(s), unix.IPPROTO_IP, unix.IP_PKTINFO, 1)
				_ = unix.SetsockoptInt(int(s), unix.IPPROTO_IPV6, unix.IPV6_RECVPKTINFO, 1)
			})
		}
	}
	return u
}

// serve answers until the socket is closed.
func (u *udpSocket) serve() {
	d, err := newDatagrams(u.conn)
	if err != nil {
		return // not a socket: nothing to read
	}
	for range udpWorkers {
		go func() {
			for q := range u.misses {
				u.answer(q)
			}
		}()
	}
	defer close(u.misses)
	var key []byte
	for {
		n, err := d.recv()
		switch {
		case errors.Is(err, net.ErrClosed):
			return
		case err != nil:
			// Not one a UDP socket gives for a datagram (ENOMEM and the
			// like): the next read may succeed, but not at once.
			time.Sleep(time.Millisecond)
			continue
		}
		handed := false
		for i := range n {
			pkt := d.packet(i)
			if len(pkt) < 12 { // what cannot be a query is dropped, as miekg/dns does
				continue
			}
			start := time.Now()
			from := d.from(i)
			client := from.Addr().Unmap()
			var ctl []byte
			if u.wild {
				ctl = replySource(d.replyCtl(), d.control(i))
			}
			if reply, a, qtype, ok := u.h.packedReply(pkt, client, &key, d.replyBuf()); ok {
				d.queue(i, len(reply), ctl)
				u.h.countPacked(a, qtype, client, start)
				continue
			}
			// The full path, here while it need not wait: the reply joins
			// the batch.
			w := &batchWriter{d: d, i: i, ctl: ctl, from: from, local: u.conn.LocalAddr()}
			if req := accept(pkt, w); req == nil || u.h.serveUDP(w, req, pkt, client, true) {
				continue
			}
			q := udpQuery{pkt: append([]byte(nil), pkt...), from: from, ctl: append([]byte(nil), ctl...)}
			select {
			case u.misses <- q:
			default:
				go u.answer(q)
			}
			handed = true
		}
		d.send()
		if handed {
			// With one P the reader would run on until its socket is
			// empty: let the queries just handed over be answered now.
			runtime.Gosched()
		}
	}
}

// answer takes a datagram through miekg/dns's acceptance rules and the
// full path, waiting for the upstream servers if it must, and keeps the
// reply for the next identical query when it may be.
func (u *udpSocket) answer(q udpQuery) {
	w := &udpWriter{conn: u.conn, to: q.from, ctl: q.ctl}
	if req := accept(q.pkt, w); req != nil {
		u.h.serveUDP(w, req, q.pkt, q.from.Addr().Unmap(), false)
	}
}

// accept applies miekg/dns's server rules to a datagram: a response is
// ignored, a message its accept function refuses or that does not unpack
// is answered FORMERR (NOTIMP for other opcodes) with its header alone.
func accept(pkt []byte, w dns.ResponseWriter) *dns.Msg {
	dh := dns.Header{Id: binary.BigEndian.Uint16(pkt), Bits: binary.BigEndian.Uint16(pkt[2:]),
		Qdcount: binary.BigEndian.Uint16(pkt[4:]), Ancount: binary.BigEndian.Uint16(pkt[6:]),
		Nscount: binary.BigEndian.Uint16(pkt[8:]), Arcount: binary.BigEndian.Uint16(pkt[10:])}
	action := dns.DefaultMsgAcceptFunc(dh)
	req := new(dns.Msg)
	switch action {
	case dns.MsgIgnore:
		return nil
	case dns.MsgAccept:
		if req.Unpack(pkt) == nil {
			return req
		}
	default:
		// The header alone: its counts zeroed, nothing else is read.
		hdr := append(append([]byte(nil), pkt[:4]...), make([]byte, 8)...)
		_ = req.Unpack(hdr)
	}
	opcode := req.Opcode
	req.SetRcodeFormatError(req)
	req.Zero = false
	if action == dns.MsgRejectNotImplemented {
		req.Opcode, req.Rcode = opcode, dns.RcodeNotImplemented
	}
	req.Ns, req.Answer, req.Extra = nil, nil, nil
	_ = w.WriteMsg(req)
	return nil
}

// replySource appends to ctl the control message that makes a reply
// leave from the address the query with control messages oob was sent to.
func replySource(ctl, oob []byte) []byte {
	hdr := unix.CmsgLen(0)
	for len(oob) >= hdr {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
		l := int(h.Len)
		if l < hdr || l > len(oob) {
			return ctl
		}
		data := oob[hdr:l]
		switch {
		case h.Level == unix.IPPROTO_IP && h.Type == unix.IP_PKTINFO && len(data) >= 12:
			info := unix.Inet4Pktinfo{}
			copy(info.Spec_dst[:], data[8:12]) // the query's destination
			return append(ctl, unix.PktInfo4(&info)...)
		case h.Level == unix.IPPROTO_IPV6 && h.Type == unix.IPV6_PKTINFO && len(data) >= 16:
			info := unix.Inet6Pktinfo{}
			copy(info.Addr[:], data[:16])
			return append(ctl, unix.PktInfo6(&info)...)
		}
		oob = oob[min(unix.CmsgSpace(l-hdr), len(oob)):]
	}
	return ctl
}

// udpWriter is the full path's dns.ResponseWriter for one datagram; it
// keeps the bytes it sent.
type udpWriter struct {
	datagramWriter
	conn *net.UDPConn
	to   netip.AddrPort
	ctl  []byte
	sent []byte
}

func (w *udpWriter) LocalAddr() net.Addr  { return w.conn.LocalAddr() }
func (w *udpWriter) RemoteAddr() net.Addr { return net.UDPAddrFromAddrPort(w.to) }
func (w *udpWriter) WriteMsg(m *dns.Msg) error {
	b, err := m.Pack()
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}
func (w *udpWriter) Write(b []byte) (int, error) {
	w.sent = b
	n, _, err := w.conn.WriteMsgUDPAddrPort(b, w.ctl, w.to)
	return n, err
}
func (w *udpWriter) sentBytes() []byte { return w.sent }

// batchWriter is the full path's ResponseWriter in the socket's loop: the
// reply joins the send batch, addressed to datagram i's source.
type batchWriter struct {
	datagramWriter
	d     *datagrams
	i     int
	ctl   []byte
	from  netip.AddrPort
	local net.Addr
	sent  []byte
}

func (w *batchWriter) LocalAddr() net.Addr  { return w.local }
func (w *batchWriter) RemoteAddr() net.Addr { return net.UDPAddrFromAddrPort(w.from) }
func (w *batchWriter) WriteMsg(m *dns.Msg) error {
	buf := w.d.replyBuf()
	b, err := m.PackBuffer(buf[:cap(buf)])
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}
func (w *batchWriter) Write(b []byte) (int, error) {
	buf := w.d.replyBuf()
	n := copy(buf[:cap(buf)], b)
	w.sent = buf[:n]
	w.d.queue(w.i, n, w.ctl)
	return n, nil
}
func (w *batchWriter) sentBytes() []byte { return w.sent }

// datagramWriter is what a ResponseWriter of one datagram does without:
// there is no connection to close, and no TSIG.
type datagramWriter struct{}

func (datagramWriter) Close() error        { return nil }
func (datagramWriter) TsigStatus() error   { return nil }
func (datagramWriter) TsigTimersOnly(bool) {}
func (datagramWriter) Hijack()             {}
