// Package handover lets a node agent that starts while another runs on its
// node (a DaemonSet rolled with maxSurge) take the node over from it
// without a moment in which neither programs it, and without two writers.
//
// What the kernel holds (nftables tables, routes, links, the persistent TUN
// device of the in-process WireGuard) outlives either process; what does
// not is the data path that runs in a process: wireguard-go's. So the
// running agent (the predecessor) keeps the node until the new one (the
// successor) has read every view it needs, then stops writing and lets go
// of its devices and sockets, and the successor opens them at once:
//
//	successor                          predecessor (listening on the socket)
//	dial, "hello"          ───────▶    not ready from now on (/readyz)
//	views synced, "take"   ───────▶    stops its features
//	                       ◀───────    "released"; idles until its SIGTERM
//	programs the node, listens on the socket for its own successor;
//	claims the data paths left running in the predecessor (parcels.go)
//
// A successor that finds no one listening, or a predecessor that goes away
// or breaks the protocol, programs the node at once, as on a plain start.
// The predecessor never exits on its own after letting go: a DaemonSet
// pod's container that exits is restarted, and would take the node back.
package handover

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"time"
)

// The protocol's lines.
const (
	hello    = "hello"
	take     = "take"
	released = "released"
)

// ReleaseTimeout bounds how long a successor waits for "released" after
// asking: a predecessor that does not answer by then is stuck, and the
// node needs an agent more than it needs a single writer.
const ReleaseTimeout = 20 * time.Second

// Predecessor is the successor's end: the agent running on the node.
type Predecessor struct {
	conn net.Conn
	r    *bufio.Reader
}

// Dial says hello to the agent listening on path; nil (and no error) when
// none listens there: the socket file is missing or stale.
func Dial(path string) (*Predecessor, error) {
	conn, err := net.DialTimeout("unix", path, time.Second)
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("agent socket %s: %w", path, err)
	}
	if _, err := fmt.Fprintln(conn, hello); err != nil {
		conn.Close()
		return nil, nil // it went away between the two: nothing to take over
	}
	return &Predecessor{conn: conn, r: bufio.NewReader(conn)}, nil
}

// Take asks the predecessor to let go of the node and returns once it has,
// or has gone away; an error says it broke the protocol or did not answer
// within ReleaseTimeout. Either way the node is the caller's afterwards;
// the connection stays open for Claim only when it was released.
func (p *Predecessor) Take(ctx context.Context) error {
	_ = p.conn.SetDeadline(time.Now().Add(ReleaseTimeout))
	stop := context.AfterFunc(ctx, func() { _ = p.conn.SetDeadline(time.Now()) })
	defer stop()
	if _, err := fmt.Fprintln(p.conn, take); err != nil {
		p.conn.Close()
		return nil // gone already
	}
	line, err := p.r.ReadString('\n')
	if strings.TrimSpace(line) == released {
		_ = p.conn.SetDeadline(time.Time{})
		return nil
	}
	p.conn.Close()
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("the running agent did not let go of the node within %v", ReleaseTimeout)
	case err != nil:
		return nil // it exited: the node is free
	}
	return fmt.Errorf("the running agent answered %q to %q", strings.TrimSpace(line), take)
}

// Claim asks the predecessor, once it released the node, for the data
// path it keeps under name (Parcels): its files, or none when it keeps
// none or is gone.
func (p *Predecessor) Claim(ctx context.Context, name string) ([]*os.File, error) {
	_ = p.conn.SetDeadline(time.Now().Add(ReleaseTimeout))
	defer p.conn.SetDeadline(time.Time{})
	stop := context.AfterFunc(ctx, func() { _ = p.conn.SetDeadline(time.Now()) })
	defer stop()
	fs, err := claimFrom(p.conn.(*net.UnixConn), name)
	if err != nil && (errors.Is(err, io.EOF) || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET)) {
		return nil, nil // gone: it keeps nothing any more
	}
	return fs, err
}

// Close drops the connection: before Take, without taking over (the
// predecessor goes on); after it, claiming nothing more.
func (p *Predecessor) Close() error { return p.conn.Close() }
