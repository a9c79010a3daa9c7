// Package nftwatch times nftables changes in a test's network namespace
// from the kernel's own change notifications.
package nftwatch

import (
	"bytes"
	"errors"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/netplane/netplane/e2e/netns"
)

// Monitor listens to the nftables change notifications of one network
// namespace: the kernel sends them when a transaction commits, so their
// arrival time is when the kernel has the change, without polling `nft list`.
// It keeps, per event, only its time and kind, and watches for byte
// patterns (an address in binary and in text form) to time one change.
type Monitor struct {
	conn      *netlink.Conn
	closeOnce sync.Once

	mu       sync.Mutex
	events   []nftEvent
	watches  map[string]*watch
	overflow int // ENOBUFS: notifications the kernel dropped
	tx       txCount
	// orphanDeletes counts transactions that deleted rules, elements,
	// chains or sets and added nothing back: the only kind that can leave
	// a Service without its rules, even for a moment.
	orphanDeletes int
}

type nftEvent struct {
	at  time.Time
	del bool
}

type watch struct {
	patterns [][]byte
	seen     chan time.Time
}

type txCount struct{ adds, dels int }

func New(b testing.TB, ns *netns.NS) *Monitor {
	b.Helper()
	f, err := os.Open(ns.Path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: int(f.Fd()), Groups: 1 << (unix.NFNLGRP_NFTABLES - 1)})
	if err != nil {
		b.Fatalf("nftables monitor in %s: %v", ns.Name, err)
	}
	if err := forceRcvBuf(c, 16<<20); err != nil {
		b.Fatal(err)
	}
	m := &Monitor{conn: c, watches: map[string]*watch{}}
	go m.loop()
	b.Cleanup(m.Close)
	return m
}

// forceRcvBuf sizes the socket's receive buffer past net.core.rmem_max, so
// that a big sync's notifications fit.
func forceRcvBuf(c *netlink.Conn, n int) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, n) }); err != nil {
		return err
	}
	return serr
}

// close stops listening. A listener anywhere on the machine counts: the
// kernel asks whether anyone at all joined the nftables group, not whether
// anyone in the committing namespace did, and builds a notification of
// every change for every commit in every namespace while one listens
// (programming 1,000 Services in another namespace: 22 ms without, 33-39
// ms with a listener here).
func (m *Monitor) Close() { m.closeOnce.Do(func() { m.conn.Close() }) }

func (m *Monitor) loop() {
	for {
		msgs, err := m.conn.Receive()
		now := time.Now()
		if errors.Is(err, syscall.ENOBUFS) {
			m.mu.Lock()
			m.overflow++
			m.mu.Unlock()
			continue
		}
		if err != nil {
			return // closed
		}
		m.mu.Lock()
		for _, msg := range msgs {
			m.record(now, msg)
		}
		m.mu.Unlock()
	}
}

func (m *Monitor) record(now time.Time, msg netlink.Message) {
	if int(msg.Header.Type)>>8 != unix.NFNL_SUBSYS_NFTABLES {
		return
	}
	switch int(msg.Header.Type) & 0xff {
	case unix.NFT_MSG_NEWGEN:
		if m.tx.dels > 0 && m.tx.adds == 0 {
			m.orphanDeletes++
		}
		m.tx = txCount{}
		return
	case unix.NFT_MSG_DELRULE, unix.NFT_MSG_DELSETELEM, unix.NFT_MSG_DELCHAIN, unix.NFT_MSG_DELSET, unix.NFT_MSG_DELTABLE:
		m.tx.dels++
		m.events = append(m.events, nftEvent{at: now, del: true})
	default:
		m.tx.adds++
		m.events = append(m.events, nftEvent{at: now})
	}
	for key, w := range m.watches {
		for _, p := range w.patterns {
			if bytes.Contains(msg.Data, p) {
				w.seen <- now
				delete(m.watches, key)
				break
			}
		}
	}
}

// watchAddr returns a channel that receives the time of the first
// notification carrying ip, in binary (rules, elements) or as text (chain
// names such as kube-proxy's endpoint chains).
func (m *Monitor) WatchAddr(ip string) <-chan time.Time {
	a := netip.MustParseAddr(ip)
	return m.WatchBytes(ip, a.AsSlice(), []byte(ip))
}

// WatchBytes returns a channel that receives the time of the first
// notification carrying any of the patterns; key names the watch (a later
// watch of the same key replaces it).
func (m *Monitor) WatchBytes(key string, patterns ...[]byte) <-chan time.Time {
	w := &watch{patterns: patterns, seen: make(chan time.Time, 1)}
	m.mu.Lock()
	m.watches[key] = w
	m.mu.Unlock()
	return w.seen
}

// Mark is a point in the monitor's log.
type Mark struct{ events, orphans, overflow int }

func (m *Monitor) Mark() Mark {
	m.mu.Lock()
	defer m.mu.Unlock()
	return Mark{len(m.events), m.orphanDeletes, m.overflow}
}

// settle waits until no notification has come for quiet (counting from the
// call when none came yet), and returns the time of the last one after mark
// (zero when none came).
func (m *Monitor) Settle(mark Mark, quiet, limit time.Duration) time.Time {
	start := time.Now()
	for {
		m.mu.Lock()
		var last time.Time
		if len(m.events) > mark.events {
			last = m.events[len(m.events)-1].at
		}
		m.mu.Unlock()
		since := time.Since(start)
		if !last.IsZero() {
			since = time.Since(last)
		}
		if time.Since(start) > limit || since > quiet {
			return last
		}
		time.Sleep(quiet / 4)
	}
}

// Counts is what came after a mark.
type Counts struct {
	Events, Deletes int
	Orphans         int // transactions that only deleted
	Overflow        int // receive overflows: counts are then incomplete
}

func (m *Monitor) Since(mark Mark) Counts {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := Counts{Events: len(m.events) - mark.events, Orphans: m.orphanDeletes - mark.orphans, Overflow: m.overflow - mark.overflow}
	for _, e := range m.events[mark.events:] {
		if e.del {
			c.Deletes++
		}
	}
	return c
}
