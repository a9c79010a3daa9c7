package nft

import (
	"cmp"
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
// and allocates a buffer per reply: for the proxy's table of 10,000
// Services that was 1.4 GB of the 1.6 GB a full sync allocated, and most
// of its time. (Upstream stopped requesting acknowledgements after v0.3.0,
// in google/nftables#336.)
//
// The library still encodes every message: its connection is dialled with
// a test hook, send, which receives the finished batch, sends it on a
// socket of our own and tells the library that all went well; the real
// outcome is kept for Wait.
//
// Set elements, the bulk of a big sync (110,000 in the proxy's table of
// 10,000 Services), are encoded here instead (element.go): the library
// builds several buffers per element. Such a message of ours records how many of the library's
// came before it; to know, beginOwn first takes the library's pending
// messages (libPending says there are some).
//
// A big sync is several transactions, and the kernel takes as long to
// apply one as we take to encode it. So Queue hands a transaction to a
// goroutine that sends it while the next one is encoded; one is in flight
// at a time, in order, and none is sent after one failed.
type batchWriter struct {
	enc        *nftables.Conn    // the library's encoder; steps use library()
	libPending bool              // enc may hold messages not yet in lib
	lib        []netlink.Message // the library's messages of the transaction
	encErr     error             // the library's encoding error, for Queue
	own        []ownMsg          // messages of ours, in order
	ownB       []byte            // their bytes, from header on
	nl         *netlink.Conn     // the socket transactions go out on
	buf        []byte            // receive buffer for acknowledgements and errors
	out        [2][]byte         // batches: one being encoded, one in flight
	cur        int               // which of out is encoded next
	seq        uint32            // sequence number of the last message sent
	// inflight delivers the outcome of the transaction being sent; nil
	// when none is.
	inflight chan error
	err      error // the first failure since the last Wait
	// commits counts the transactions the kernel committed (it announced a
	// new generation): each advanced the nftables generation by one. One
	// that changed nothing commits nothing.
	commits int
	// lead, when set, starts every transaction (see leadWith).
	lead []byte
}

// ownMsg is a message of ours: ownB[off:end], after at library messages.
type ownMsg struct{ at, off, end int }

func newBatchWriter(d Dialer) (*batchWriter, error) {
	nl, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: d.NetNS})
	if err != nil {
		return nil, err
	}
	// An error answer carries only the failed message's header, not the
	// whole message, so every answer fits buf.
	if err := errors.Join(bigBuffers(nl), nl.SetOption(netlink.CapAcknowledge, true)); err != nil {
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

// generation asks the kernel for the namespace's nftables generation.
func (w *batchWriter) generation() (uint32, error) {
	msgs, err := w.nl.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN), Flags: netlink.Request},
		Data:   []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0},
	})
	if err != nil {
		return 0, err
	}
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return 0, err
		}
		ad.ByteOrder = binary.BigEndian
		for ad.Next() {
			if ad.Type() == unix.NFTA_GEN_ID {
				return ad.Uint32(), nil
			}
		}
	}
	return 0, errors.New("the kernel's generation reply has no id")
}

func (w *batchWriter) Close() { w.nl.Close() }

// Flush sends the messages added to enc as one transaction and returns
// the first failure of it or of those queued before it.
func (w *batchWriter) Flush() error {
	err := w.Queue()
	if werr := w.Wait(); werr != nil && werr != err {
		err = errors.Join(err, werr)
	}
	return err
}

// Queue hands the messages added since the last Queue to the sender as one
// transaction. It returns an encoding error, or a failure of an earlier
// transaction (then nothing more is sent until Wait).
func (w *batchWriter) Queue() error {
	w.takeLib()
	n := len(w.lib) + len(w.own)
	encErr := w.encErr
	if encErr != nil || w.err != nil || n == 0 {
		w.discard()
		return cmp.Or(encErr, w.err)
	}
	if w.lead != nil {
		n++
	}
	out, begin := w.encode()
	w.discard()
	w.settle()
	if w.err == nil {
		done := make(chan error, 1)
		w.inflight = done
		go func() { done <- w.transact(out, begin, begin+uint32(n), n) }()
	}
	return w.err
}

// Discard drops the messages added since the last Queue.
func (w *batchWriter) Discard() {
	w.takeLib()
	w.discard()
}

func (w *batchWriter) discard() {
	w.lib, w.encErr, w.own, w.ownB = w.lib[:0], nil, w.own[:0], w.ownB[:0]
}

// Wait waits for the transaction in flight and returns the first failure
// since the last Wait.
func (w *batchWriter) Wait() error {
	w.settle()
	err := w.err
	w.err = nil
	return err
}

// settle waits for the transaction in flight, keeping its failure.
func (w *batchWriter) settle() {
	if w.inflight != nil {
		if err := <-w.inflight; err != nil && w.err == nil {
			w.err = err
		}
		w.inflight = nil
	}
}

// send is the library's view of the kernel. Given a batch it keeps its
// messages for Queue; asked for replies (nil) it has none, which the
// library takes as success for every message (it never asks the kernel
// anything else on this connection).
func (w *batchWriter) send(req []netlink.Message) ([]netlink.Message, error) {
	if len(req) > 2 {
		w.lib = append(w.lib, req[1:len(req)-1]...) // without BATCH_BEGIN and BATCH_END
	}
	return nil, io.EOF
}

// leadWith starts every transaction with an update of family's table name
// that changes nothing (it names no flags) and carries the echo flag, so
// that the flag costs nothing: the kernel echoes the first message's own
// change too, and a first message of 1,000 elements took 7% of a big sync
// to echo. A missing table is created, as the sync would.
func (w *batchWriter) leadWith(family nftables.TableFamily, name string) {
	b := appendHeader(nil, 0, unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWTABLE, unix.NLM_F_REQUEST|unix.NLM_F_CREATE|unix.NLM_F_ECHO, 0)
	b = append(b, byte(family), unix.NFNETLINK_V0, 0, 0)
	b = appendString(b, unix.NFTA_TABLE_NAME, name)
	binary.NativeEndian.PutUint32(b, uint32(len(b)))
	w.lead = b
}

// library is the library's encoder, for adding messages to the transaction.
func (w *batchWriter) library() *nftables.Conn {
	w.libPending = true
	return w.enc
}

// takeLib moves the library's pending messages to lib.
func (w *batchWriter) takeLib() {
	if w.libPending {
		w.libPending = false
		if err := w.enc.Flush(); err != nil && w.encErr == nil { // calls send
			w.encErr = err
		}
	}
}

// beginOwn starts a message of ours of nftables type typ, after the library
// messages added so far. Attributes are appended to ownB; endOwn ends it.
func (w *batchWriter) beginOwn(typ uint16, family nftables.TableFamily) {
	w.takeLib()
	w.own = append(w.own, ownMsg{at: len(w.lib), off: len(w.ownB)})
	w.ownB = appendHeader(w.ownB, 0, unix.NFNL_SUBSYS_NFTABLES<<8|typ, unix.NLM_F_REQUEST|unix.NLM_F_CREATE, 0)
	w.ownB = append(w.ownB, byte(family), unix.NFNETLINK_V0, 0, 0)
}

func (w *batchWriter) endOwn() {
	m := &w.own[len(w.own)-1]
	m.end = len(w.ownB)
	binary.NativeEndian.PutUint32(w.ownB[m.off:], uint32(m.end-m.off))
}

// encode writes the transaction (BATCH_BEGIN, the library's messages and
// ours in order, BATCH_END) into the buffer not in flight, asking only its
// last message for an acknowledgement, and returns it with the sequence
// number of BATCH_BEGIN.
func (w *batchWriter) encode() ([]byte, uint32) {
	batchHdr := []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, unix.NFNL_SUBSYS_NFTABLES} // res_id, big-endian
	out := w.out[w.cur][:0]
	begin := w.seq + 1
	seq := begin
	out = appendHeader(out, unix.NLMSG_HDRLEN+4, unix.NFNL_MSG_BATCH_BEGIN, unix.NLM_F_REQUEST, seq)
	out = append(out, batchHdr...)
	if w.lead != nil {
		seq++
		out = append(out, w.lead...)
		binary.NativeEndian.PutUint32(out[len(out)-len(w.lead)+8:], seq)
	}
	last := 0 // offset of the last message's header
	ownNext := 0
	putOwn := func(upTo int) {
		for ; ownNext < len(w.own) && w.own[ownNext].at <= upTo; ownNext++ {
			m := w.own[ownNext]
			seq++
			last = len(out)
			out = append(out, w.ownB[m.off:m.end]...)
			binary.NativeEndian.PutUint32(out[last+8:], seq)
		}
	}
	putOwn(0)
	for i, m := range w.lib {
		seq++
		last = len(out)
		size := unix.NLMSG_HDRLEN + len(m.Data)
		out = appendHeader(out, size, uint16(m.Header.Type), uint16(m.Header.Flags&^(netlink.Acknowledge|netlink.Echo)), seq)
		out = append(out, m.Data...)
		out = append(out, make([]byte, pad4(size))...)
		putOwn(i + 1)
	}
	setFlag(out[last:], unix.NLM_F_ACK)
	// The echo flag on the first message makes the kernel answer with the
	// generation it commits (it reads the flag there, not on BATCH_BEGIN),
	// besides echoing that message's own change.
	setFlag(out[unix.NLMSG_HDRLEN+4:], unix.NLM_F_ECHO)
	seq++
	out = appendHeader(out, unix.NLMSG_HDRLEN+4, unix.NFNL_MSG_BATCH_END, unix.NLM_F_REQUEST, seq)
	out = append(out, batchHdr...)
	w.seq = seq
	w.out[w.cur] = out
	w.cur = 1 - w.cur
	return out, begin
}

// transact sends one encoded batch in one sendmsg. The kernel processes
// it within that call and queues its answers: the generation it committed
// (NEWGEN, asked for by the echo flag on the first message, and sent only
// if the batch changed anything), each failed message's error, and the
// acknowledgement of the last message (end), or one error for the batch
// itself (begin) when it refuses it outright. So everything is read without
// waiting; an answer missing means the kernel dropped the batch.
func (w *batchWriter) transact(out []byte, begin, end uint32, last int) error {
	raw, err := w.nl.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Write(func(fd uintptr) bool {
		serr = unix.Sendto(int(fd), out, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
		return serr != unix.EAGAIN
	}); err != nil || serr != nil {
		return fmt.Errorf("sending a transaction of %d messages: %w", last, errors.Join(err, serr))
	}
	var errs []error
	for {
		var n int
		var rerr error
		if err := raw.Read(func(fd uintptr) bool {
			n, _, rerr = unix.Recvfrom(int(fd), w.buf, unix.MSG_DONTWAIT|unix.MSG_TRUNC)
			return true
		}); err != nil {
			return errors.Join(append(errs, err)...)
		}
		switch {
		case errors.Is(rerr, unix.EAGAIN):
			return errors.Join(append(errs, fmt.Errorf("the kernel did not answer a transaction of %d messages", last))...)
		case rerr != nil:
			return errors.Join(append(errs, fmt.Errorf("receiving the kernel's answer: %w", rerr))...)
		case n > len(w.buf):
			return errors.Join(append(errs, fmt.Errorf("an answer of %d bytes to a transaction was cut off", n))...)
		}
		for b := w.buf[:n]; len(b) >= unix.NLMSG_HDRLEN; {
			size := int(binary.NativeEndian.Uint32(b[0:4]))
			if size < unix.NLMSG_HDRLEN || size > len(b) {
				break
			}
			typ, data := binary.NativeEndian.Uint16(b[4:6]), b[unix.NLMSG_HDRLEN:size]
			b = b[min((size+3)&^3, len(b)):]
			if typ == unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWGEN {
				w.commits++
				continue
			}
			if typ != unix.NLMSG_ERROR || len(data) < 4+unix.NLMSG_HDRLEN {
				continue
			}
			errno := -int32(binary.NativeEndian.Uint32(data[0:4]))
			seq := binary.NativeEndian.Uint32(data[4+8 : 4+12]) // of the message it answers
			switch {
			case errno != 0 && seq == begin:
				errs = append(errs, fmt.Errorf("the kernel refused a transaction of %d messages: %w", last, unix.Errno(errno)))
			case errno != 0:
				// Numbered as they were queued, the lead (if any) not counted.
				lead := 0
				if w.lead != nil {
					lead = 1
				}
				errs = append(errs, fmt.Errorf("message %d of %d: %w", int(seq)-int(begin)-lead, last-lead, unix.Errno(errno)))
			}
			if seq == end || seq == begin { // the acknowledgement, or the batch refused
				return errors.Join(errs...)
			}
		}
	}
}
