package wireguard

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"unsafe"

	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/conn"
)

// A tunnel's datagrams come in runs of one size (a TCP stream split at
// the MTU): the kernel sends such a run as one datagram it splits on the
// way out (UDP GSO), and joins a run that arrives into one it hands over
// with the size of its parts (UDP GRO). Both cut the per-datagram cost of
// the socket layer, which is most of a userspace tunnel's.

// maxSegments is how many datagrams the kernel joins or splits at most
// (UDP_MAX_SEGMENTS on older kernels; newer ones allow 128).
const maxSegments = 64

// maxJoined bounds a joined datagram's payload: the largest IP packet less
// an IPv6 and a UDP header.
const maxJoined = 1<<16 - 1 - 40 - 8

// enableOffload turns GRO on and says what the kernel offers c.
func enableOffload(c *net.UDPConn) (gso, gro bool) {
	rc, err := c.SyscallConn()
	if err != nil {
		return false, false
	}
	_ = rc.Control(func(fd uintptr) {
		_, err := unix.GetsockoptInt(int(fd), unix.IPPROTO_UDP, unix.UDP_SEGMENT)
		gso = err == nil
		gro = unix.SetsockoptInt(int(fd), unix.IPPROTO_UDP, unix.UDP_GRO, 1) == nil
	})
	return gso, gro
}

// receive is the socket's conn.ReceiveFunc; wireguard-go calls each from
// one goroutine, so its messages are its own.
func (s *udpSocket) receive() conn.ReceiveFunc {
	ms := make([]ipv4.Message, conn.IdealBatchSize)
	for i := range ms {
		ms[i].Buffers = make([][]byte, 1)
		ms[i].OOB = make([]byte, unix.CmsgSpace(4))
	}
	return func(bufs [][]byte, sizes []int, eps []conn.Endpoint) (int, error) {
		if !s.gro {
			m := ms[:min(len(bufs), len(ms))]
			for i := range m {
				m[i].Buffers[0] = bufs[i]
			}
			n, err := s.pc.ReadBatch(m, 0)
			for i := range n {
				sizes[i], eps[i] = m[i].N, endpointOf(m[i].Addr)
			}
			return n, err
		}
		// Joined datagrams are read into the last buffers and split into
		// the first: each holds at most maxSegments parts.
		k := max(1, len(bufs)/maxSegments)
		m := ms[:k]
		at := len(bufs) - k
		for i := range m {
			m[i].Buffers[0], m[i].OOB = bufs[at+i], m[i].OOB[:cap(m[i].OOB)]
		}
		n, err := s.pc.ReadBatch(m, 0)
		if err != nil {
			return 0, err
		}
		out := 0
		for i := range n {
			ep := endpointOf(m[i].Addr)
			src := bufs[at+i][:m[i].N]
			size := segmentSize(m[i].OOB[:m[i].NN])
			if size <= 0 || size > len(src) {
				size = len(src)
			}
			// A part goes no further than its own datagram's buffer,
			// the next one's is still to be split.
			for off := 0; off < len(src) && out <= at+i; off += size {
				part := src[off:min(off+size, len(src))]
				sizes[out], eps[out] = copy(bufs[out][:cap(bufs[out])], part), ep
				out++
			}
		}
		return out, nil
	}
}

// segmentSize is the size of the parts of a datagram the kernel joined,
// from its control message; 0 when it is one datagram.
func segmentSize(oob []byte) int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return 0
	}
	for _, m := range msgs {
		if m.Header.Level == unix.IPPROTO_UDP && m.Header.Type == unix.UDP_GRO && len(m.Data) >= 4 {
			return int(*(*int32)(unsafe.Pointer(&m.Data[0])))
		}
	}
	return 0
}

func endpointOf(a net.Addr) conn.Endpoint {
	ua, _ := a.(*net.UDPAddr)
	if ua == nil {
		return &conn.StdNetEndpoint{}
	}
	return &conn.StdNetEndpoint{AddrPort: ua.AddrPort()}
}

// sendBatch is what one Send needs: messages and the bytes of the
// datagrams it joins.
type sendBatch struct {
	ms    []ipv4.Message
	joins []byte
	oobs  []byte
}

var sendBatches = sync.Pool{New: func() any {
	b := &sendBatch{ms: make([]ipv4.Message, conn.IdealBatchSize), oobs: make([]byte, conn.IdealBatchSize*unix.CmsgSpace(2))}
	for i := range b.ms {
		b.ms[i].Buffers = make([][]byte, 1)
	}
	return b
}}

func (s *udpSocket) send(bufs [][]byte, dst netip.AddrPort) error {
	b := sendBatches.Get().(*sendBatch)
	defer sendBatches.Put(b)
	addr := net.UDPAddrFromAddrPort(dst)
	n := b.fill(bufs, addr, s.gso.Load())
	err := s.write(b.ms[:n])
	if err != nil && n < len(bufs) && errors.Is(err, unix.EIO) {
		// A device on the way that cannot checksum joined datagrams;
		// from now on each goes on its own.
		s.gso.Store(false)
		n = b.fill(bufs, addr, false)
		err = s.write(b.ms[:n])
	}
	return err
}

func (s *udpSocket) write(ms []ipv4.Message) error {
	for len(ms) > 0 {
		n, err := s.pc.WriteBatch(ms, 0)
		if err != nil {
			return err
		}
		ms = ms[n:]
	}
	return nil
}

// fill makes the messages for bufs to addr: with join, each run of
// datagrams of one size (the last of a run may be shorter) as one.
func (b *sendBatch) fill(bufs [][]byte, addr *net.UDPAddr, join bool) int {
	if len(b.ms) < len(bufs) {
		b.grow(len(bufs))
	}
	if !join {
		for i, p := range bufs {
			b.ms[i].Buffers[0], b.ms[i].OOB, b.ms[i].Addr = p, nil, addr
		}
		return len(bufs)
	}
	total := 0
	for _, p := range bufs {
		total += len(p)
	}
	if cap(b.joins) < total {
		b.joins = make([]byte, 0, total)
	}
	joins := b.joins[:0]
	n := 0
	for i := 0; i < len(bufs); {
		size, j, bytes := len(bufs[i]), i+1, len(bufs[i])
		for j < len(bufs) && j-i < maxSegments && len(bufs[j]) <= size && bytes+len(bufs[j]) <= maxJoined && len(bufs[j-1]) == size {
			bytes += len(bufs[j])
			j++
		}
		m := &b.ms[n]
		m.Addr, m.OOB = addr, nil
		if j-i == 1 {
			m.Buffers[0] = bufs[i]
		} else {
			start := len(joins)
			for _, p := range bufs[i:j] {
				joins = append(joins, p...)
			}
			m.Buffers[0] = joins[start:]
			m.OOB = b.segmentOOB(n, size)
		}
		n++
		i = j
	}
	return n
}

func (b *sendBatch) grow(n int) {
	b.ms = make([]ipv4.Message, n)
	for i := range b.ms {
		b.ms[i].Buffers = make([][]byte, 1)
	}
	b.oobs = make([]byte, n*unix.CmsgSpace(2))
}

// segmentOOB is message i's control message: split into parts of size.
func (b *sendBatch) segmentOOB(i, size int) []byte {
	space := unix.CmsgSpace(2)
	oob := b.oobs[i*space : (i+1)*space]
	h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
	h.Level, h.Type = unix.IPPROTO_UDP, unix.UDP_SEGMENT
	h.SetLen(unix.CmsgLen(2))
	*(*uint16)(unsafe.Pointer(&oob[unix.CmsgLen(0)])) = uint16(size)
	return oob
}
