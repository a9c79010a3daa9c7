package handover

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
)

// Listener is the predecessor's end: the agent that programs the node,
// waiting for a successor.
type Listener struct {
	l     *net.UnixListener
	come  chan *Successor
	done  chan struct{} // closed by Close
	close sync.Once
}

// Listen listens on path for successors. A socket file left there by an
// agent that is gone is replaced; call it only once Dial found no one
// listening, or after taking over from the one that was.
func Listen(path string) (*Listener, error) {
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return nil, fmt.Errorf("agent socket %s: %w", path, err)
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("agent socket: %w", err)
	}
	// The socket file stays when the listener closes: the successor
	// replaces it, and until then a dial is refused, which is "no one".
	l.SetUnlinkOnClose(false)
	ln := &Listener{l: l, come: make(chan *Successor), done: make(chan struct{})}
	go ln.accept()
	return ln, nil
}

// Successors yields each successor that said hello, one at a time.
func (ln *Listener) Successors() <-chan *Successor { return ln.come }

// Close stops listening; a successor dialling afterwards finds no one.
func (ln *Listener) Close() error {
	var err error
	ln.close.Do(func() {
		close(ln.done)
		err = ln.l.Close()
	})
	return err
}

func (ln *Listener) accept() {
	for {
		conn, err := ln.l.Accept()
		if err != nil {
			return // closed
		}
		s := &Successor{conn: conn, taking: make(chan struct{}), gone: make(chan struct{})}
		if !s.hello() {
			conn.Close()
			continue
		}
		go s.read()
		// Handed over only while someone listens: after Close, a
		// successor waiting here is dropped and programs the node itself.
		select {
		case ln.come <- s:
		case <-s.gone:
		case <-ln.done:
			s.Drop()
		}
	}
}

// Successor is a new agent that said hello.
type Successor struct {
	conn   net.Conn
	r      *bufio.Reader
	taking chan struct{} // closed on "take"
	gone   chan struct{} // closed when it hangs up before "take"
}

func (s *Successor) hello() bool {
	s.r = bufio.NewReader(s.conn)
	line, err := s.r.ReadString('\n')
	return err == nil && strings.TrimSpace(line) == hello
}

func (s *Successor) read() {
	line, err := s.r.ReadString('\n')
	if err == nil && strings.TrimSpace(line) == take {
		close(s.taking)
		return
	}
	close(s.gone)
	s.conn.Close()
}

// Taking is closed when the successor asks for the node.
func (s *Successor) Taking() <-chan struct{} { return s.taking }

// Gone is closed when the successor hung up without asking: it exited.
func (s *Successor) Gone() <-chan struct{} { return s.gone }

// Release tells the successor the node is its own; call it once nothing
// of this agent writes to the node any more. The successor may then claim
// the data paths kept in ps, until it hangs up.
func (s *Successor) Release(ps *Parcels) error {
	if _, err := fmt.Fprintln(s.conn, released); err != nil {
		s.conn.Close()
		return err
	}
	go serveClaims(s.conn.(*net.UnixConn), ps)
	return nil
}

// Drop hangs up on the successor without releasing: it programs the node
// itself (this agent is stopping anyway).
func (s *Successor) Drop() { s.conn.Close() }
