package proxy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// batchWriter sends the transactions google/nftables encodes, asking the
// kernel for one acknowledgement per transaction. google/nftables v0.3.0
// asks for an acknowledgement of every message and an echo of every rule,
// and allocates a buffer per reply: at 10,000 Services that was 1.4 GB of
// the 1.6 GB a full sync allocated, and most of its time. (Upstream stopped
// requesting acknowledgements after v0.3.0, in google/nftables#336.)
//
// The library still encodes every message: its connection is dialled with
// a test hook, send, which receives the finished batch, sends it on a
// socket of our own and tells the library that all went well; the real
// outcome is kept in err.
type batchWriter struct {
	enc *nftables.Conn // the plan's steps add their messages here
	nl  *netlink.Conn  // the socket transactions go out on
	buf []byte         // receive buffer for acknowledgements and errors
	out []byte         // the batch being sent
	seq uint32         // sequence number of the last message sent
	err error          // outcome of the last transaction
}

func newBatchWriter(d Dialer) (*batchWriter, error) {
	nl, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: d.NetNS})
	if err != nil {
		return nil, err
	}
	if err := bigBuffers(nl); err != nil {
		nl.Close()
		return nil, err
	}
	w := &batchWriter{nl: nl, buf: make([]byte, 64<<10)}
	if w.enc, err = nftables.New(nftables.WithTestDial(w.send)); err != nil {
		nl.Close()
		return nil, err
	}
	return w, nil
}

// port is the netlink port of the writing socket, which the kernel puts in
// the notifications of the changes it makes.
func (w *batchWriter) port() (uint32, error) { return portID(w.nl) }

func (w *batchWriter) Close() { w.nl.Close() }

// Flush sends the messages added to enc as one transaction.
func (w *batchWriter) Flush() error {
	w.err = nil
	if err := w.enc.Flush(); err != nil {
		return err // an encoding error: nothing was sent
	}
	return w.err
}

// send is the library's view of the kernel. Given the batch it sends it for
// real; asked for replies (nil) it has none, which the library takes as
// success for every message (it never asks the kernel anything else on
// this connection).
func (w *batchWriter) send(req []netlink.Message) ([]netlink.Message, error) {
	if len(req) > 0 {
		w.err = w.transact(req)
	}
	return nil, io.EOF
}

// transact sends one batch (BATCH_BEGIN, messages, BATCH_END) asking only
// its last message for an acknowledgement. The kernel processes the whole
// batch and then reports each failed message and that acknowledgement, or
// one error for the batch itself when it refuses it outright.
func (w *batchWriter) transact(req []netlink.Message) error {
	last := len(req) - 2 // the message before BATCH_END
	if last < 1 {
		return nil
	}
	// One buffer, reused, in one sendmsg: the library's own marshalling
	// allocates per message and again for the whole batch.
	w.out = w.out[:0]
	w.seq += uint32(len(req))
	begin := w.seq - uint32(len(req)) + 1
	for i, m := range req {
		flags := m.Header.Flags &^ (netlink.Acknowledge | netlink.Echo)
		if i == last {
			flags |= netlink.Acknowledge
		}
		size := unix.NLMSG_HDRLEN + len(m.Data)
		w.out = binary.NativeEndian.AppendUint32(w.out, uint32(size))
		w.out = binary.NativeEndian.AppendUint16(w.out, uint16(m.Header.Type))
		w.out = binary.NativeEndian.AppendUint16(w.out, uint16(flags))
		w.out = binary.NativeEndian.AppendUint32(w.out, begin+uint32(i))
		w.out = binary.NativeEndian.AppendUint32(w.out, 0)
		w.out = append(w.out, m.Data...)
		w.out = append(w.out, make([]byte, (4-size%4)%4)...)
	}
	end := begin + uint32(last)
	raw, err := w.nl.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Write(func(fd uintptr) bool {
		serr = unix.Sendto(int(fd), w.out, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
		return serr != unix.EAGAIN
	}); err != nil || serr != nil {
		return fmt.Errorf("sending a transaction of %d messages: %w", last, errors.Join(err, serr))
	}
	var errs []error
	for {
		var n int
		var rerr error
		if err := raw.Read(func(fd uintptr) bool {
			n, _, rerr = unix.Recvfrom(int(fd), w.buf, 0)
			return rerr != unix.EAGAIN
		}); err != nil {
			return err
		}
		if rerr != nil {
			return errors.Join(append(errs, fmt.Errorf("receiving the kernel's answer: %w", rerr))...)
		}
		for b := w.buf[:n]; len(b) >= unix.NLMSG_HDRLEN; {
			size := int(binary.NativeEndian.Uint32(b[0:4]))
			if size < unix.NLMSG_HDRLEN || size > len(b) {
				break
			}
			typ, data := binary.NativeEndian.Uint16(b[4:6]), b[unix.NLMSG_HDRLEN:size]
			b = b[min((size+3)&^3, len(b)):]
			if typ != unix.NLMSG_ERROR || len(data) < 4+unix.NLMSG_HDRLEN {
				continue
			}
			errno := -int32(binary.NativeEndian.Uint32(data[0:4]))
			seq := binary.NativeEndian.Uint32(data[4+8 : 4+12]) // of the message it answers
			if errno != 0 {
				errs = append(errs, fmt.Errorf("message %d of %d: %w", int(seq)-int(begin), last, unix.Errno(errno)))
			}
			if seq == end || seq == begin { // the acknowledgement, or the batch refused
				return errors.Join(errs...)
			}
		}
	}
}
