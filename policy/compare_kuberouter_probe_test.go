package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
)

// How BenchmarkPolicyAgainstKubeRouter sees the kernel: TCP connects from
// a pod's namespace, bound to one of its addresses (the pod whose policy
// applies), and for netplane the nftables change notifications of a node.

// vsSocket is a non-blocking TCP socket bound to src and a port of its
// own, reset on close (no TIME_WAIT). Ports cycle through 10000-29999, so
// that an attempt never meets the conntrack entry of a recent one.
func vsSocket(src netip.Addr) (int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	_ = unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
	for range 100 {
		err = unix.Bind(fd, &unix.SockaddrInet4{Addr: src.As4(), Port: 10000 + int(vsPort.Add(1)%20000)})
		if !errors.Is(err, unix.EADDRINUSE) {
			break
		}
	}
	if err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("bind %s: %w", src, err)
	}
	return fd, nil
}

var vsPort atomic.Uint32

func vsSockaddr(dst netip.AddrPort) *unix.SockaddrInet4 {
	return &unix.SockaddrInet4{Addr: dst.Addr().As4(), Port: int(dst.Port())}
}

// vsConnectTimes times n TCP connects, one after the other on one OS
// thread, from src (in ns) to dst, each from the connect call to the
// handshake's end, failing after limit. The result is in the order
// measured. The thread runs at a real-time priority meanwhile: the whole
// handshake runs in the connect call (the kernel answers a SYN in the
// same softirq that forwards it), and on a shared machine other
// processes preempting the thread would otherwise set the tail.
func vsConnectTimes(ns *netns.NS, src netip.Addr, dst netip.AddrPort, n int, limit time.Duration) ([]time.Duration, error) {
	out := make([]time.Duration, 0, n)
	sa := vsSockaddr(dst)
	err := ns.Do(func() error {
		if err := unix.SchedSetAttr(0, &unix.SchedAttr{Policy: unix.SCHED_FIFO, Priority: 1}, 0); err != nil {
			return fmt.Errorf("real-time priority: %w", err)
		}
		defer unix.SchedSetAttr(0, &unix.SchedAttr{Policy: unix.SCHED_NORMAL}, 0)
		for range n {
			fd, err := vsSocket(src)
			if err != nil {
				return err
			}
			t0 := time.Now()
			err = unix.Connect(fd, sa)
			if errors.Is(err, unix.EINPROGRESS) {
				err = framework.WaitConnected(fd, limit)
			}
			d := time.Since(t0)
			unix.Close(fd)
			if err != nil {
				return fmt.Errorf("connect %s → %s: %w", src, dst, err)
			}
			out = append(out, d)
		}
		return nil
	})
	return out, err
}

// vsAttemptLimit is how long an attempt may take to count as allowed: an
// allowed connect takes well under a millisecond here, and an attempt
// whose first SYN was dropped would only succeed on the retransmission,
// a second later, after the change it must not be credited to.
const vsAttemptLimit = 100 * time.Millisecond

// vsFlipRun is how many attempts in a row must agree before a flip counts.
const vsFlipRun = 3

// vsFlip returns the start time of the first connect attempt from src (in
// ns) to dst that had the wanted outcome (allowed: answered within
// vsAttemptLimit; denied: refused, unreachable or unanswered) and was
// followed by vsFlipRun-1 more such attempts. Attempts start every
// millisecond, and later every half percent of the time waited, each
// without waiting for the one before, so the resolution is about 1 ms. It
// gives up when p (if not nil) exits.
func vsFlip(ns *netns.NS, src netip.Addr, dst netip.AddrPort, allowed bool, limit time.Duration, p *framework.Process) (time.Time, error) {
	type attempt struct {
		fd     int
		start  time.Time
		failed bool // connect failed at once
	}
	var flip time.Time
	sa := vsSockaddr(dst)
	err := ns.Do(func() error {
		var open []attempt
		defer func() {
			for _, a := range open {
				unix.Close(a.fd)
			}
		}()
		run := 0
		var runStart time.Time
		// judge takes the attempts' outcomes in the order they started.
		judge := func(a attempt, ok bool) bool {
			if ok != allowed {
				run = 0
				return false
			}
			if run == 0 {
				runStart = a.start
			}
			run++
			return run >= vsFlipRun
		}
		start := time.Now()
		next := start
		for now := start; now.Sub(start) < limit; now = time.Now() {
			if p != nil && p.Exited() {
				return fmt.Errorf("%s exited", p.Name)
			}
			if !now.Before(next) {
				next = now.Add(max(time.Millisecond, now.Sub(start)/200))
				fd, err := vsSocket(src)
				if err != nil {
					return err
				}
				err = unix.Connect(fd, sa)
				open = append(open, attempt{fd, now, err != nil && !errors.Is(err, unix.EINPROGRESS)})
			}
			fds := make([]int, len(open))
			for i, a := range open {
				fds[i] = a.fd
			}
			finished, answered, err := framework.PollConnects(fds, time.Millisecond)
			if err != nil {
				return err
			}
			now = time.Now()
			// Resolve attempts from the oldest on, up to the first one
			// still pending.
			done := 0
		resolve:
			for i, a := range open {
				var ok bool
				switch {
				case a.failed:
				case finished[i]:
					ok = answered[i]
				case now.Sub(a.start) > vsAttemptLimit:
				default:
					break resolve
				}
				unix.Close(a.fd)
				done++
				if judge(a, ok) {
					flip = runStart
					open = open[done:]
					return nil
				}
			}
			open = open[done:]
		}
		return fmt.Errorf("%s → %s: not %s within %v", src, dst, map[bool]string{true: "allowed", false: "denied"}[allowed], limit)
	})
	return flip, err
}

// vsStream sends one TCP stream from src (in ns) to dst for d and returns
// the rate the server received, in bits per second.
func vsStream(ns *netns.NS, src netip.Addr, dst netip.AddrPort, d time.Duration, results <-chan vsStreamResult) (float64, error) {
	for len(results) > 0 { // a stale result of an earlier stream
		<-results
	}
	err := ns.Do(func() error {
		fd, err := vsSocket(src)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := unix.Connect(fd, vsSockaddr(dst)); err != nil && !errors.Is(err, unix.EINPROGRESS) {
			return err
		}
		if err := framework.WaitConnected(fd, time.Second); err != nil {
			return err
		}
		// A graceful end, so the server reads to the last byte.
		_ = unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{})
		if err := unix.SetNonblock(fd, false); err != nil {
			return err
		}
		buf := make([]byte, 256<<10)
		for end := time.Now().Add(d); time.Now().Before(end); {
			if _, err := unix.Write(fd, buf); err != nil && !errors.Is(err, unix.EINTR) {
				return err
			}
		}
		return unix.Shutdown(fd, unix.SHUT_WR)
	})
	if err != nil {
		return 0, err
	}
	select {
	case r := <-results:
		return float64(r.bytes*8) / r.last.Sub(r.first).Seconds(), nil
	case <-time.After(10 * time.Second):
		return 0, fmt.Errorf("the server reported no stream from %s", src)
	}
}

// vsCommits records when transactions that touched one nftables table
// were committed in one network namespace, from the kernel's change
// notifications. While it listens, the kernel builds a notification of
// every change of every commit on the machine, so it is opened only for
// the change samples.
type vsCommits struct {
	conn  *netlink.Conn
	table string

	mu      sync.Mutex
	touched bool        // the transaction being read touched table
	commits []time.Time // when each transaction that touched it ended
	lost    int         // receive buffer overflows
}

func newVSCommits(ns *netns.NS, table string) (*vsCommits, error) {
	f, err := os.Open(ns.Path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: int(f.Fd()), Groups: 1 << (unix.NFNLGRP_NFTABLES - 1)})
	if err != nil {
		return nil, fmt.Errorf("nftables monitor in %s: %w", ns.Name, err)
	}
	w := &vsCommits{conn: c, table: table}
	go w.loop()
	return w, nil
}

func (w *vsCommits) loop() {
	for {
		msgs, err := w.conn.Receive()
		now := time.Now()
		if errors.Is(err, syscall.ENOBUFS) {
			w.mu.Lock()
			w.lost++
			w.mu.Unlock()
			continue
		}
		if err != nil {
			return // closed
		}
		w.mu.Lock()
		for _, m := range msgs {
			if int(m.Header.Type)>>8 != unix.NFNL_SUBSYS_NFTABLES {
				continue
			}
			if int(m.Header.Type)&0xff == unix.NFT_MSG_NEWGEN {
				if w.touched {
					w.commits = append(w.commits, now)
				}
				w.touched = false
				continue
			}
			w.touched = w.touched || vsNamesTable(m.Data, w.table)
		}
		w.mu.Unlock()
	}
}

// vsNamesTable reports whether an nftables object notification is about
// table: every object's first attribute (type 1) is its table's name.
func vsNamesTable(data []byte, table string) bool {
	if len(data) < 4 {
		return false
	}
	ad, err := netlink.NewAttributeDecoder(data[4:])
	if err != nil {
		return false
	}
	for ad.Next() {
		if ad.Type() == 1 {
			return ad.String() == table
		}
	}
	return false
}

// firstAfter is the first commit at or after t, waiting up to limit.
func (w *vsCommits) firstAfter(t time.Time, limit time.Duration) (time.Time, bool) {
	for deadline := time.Now().Add(limit); ; time.Sleep(time.Millisecond) {
		w.mu.Lock()
		for _, c := range w.commits {
			if !c.Before(t) {
				w.mu.Unlock()
				return c, true
			}
		}
		w.mu.Unlock()
		if time.Now().After(deadline) {
			return time.Time{}, false
		}
	}
}

func (w *vsCommits) close() { w.conn.Close() }
