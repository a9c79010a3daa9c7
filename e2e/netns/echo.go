package netns

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/netplane/netplane/e2e/framework"
)

// The echo server every network test talks to, and its clients. It answers
// each TCP line and each UDP datagram with one line, "<name> <client
// address as the server sees it>", so a client learns which server answered
// and whether its address was translated on the way. The TCP line "echo"
// turns the connection into a byte echo until EOF, for transfers.

// EchoTimeout is how long a client waits for a connection or an answer,
// unless it says otherwise.
const EchoTimeout = 2 * time.Second

// ServeEcho runs, inside ns, a TCP and a UDP echo server on addr (":port"
// serves both families) answering as name. They stop with the test.
func (ns *NS) ServeEcho(t testing.TB, addr, name string) {
	t.Helper()
	l, err := ns.Listen(addr)
	if err != nil {
		t.Fatal(err)
	}
	var pc net.PacketConn
	if err := ns.Do(func() (err error) { pc, err = net.ListenPacket("udp", addr); return err }); err != nil {
		l.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	framework.Serve(t, l, func(c net.Conn) { answerTCP(c, name) })
	go func() {
		buf := make([]byte, 1500)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo([]byte(name+" "+hostOf(from)+"\n"), from)
		}
	}()
}

func answerTCP(c net.Conn, name string) {
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		if strings.TrimSpace(line) == "echo" {
			_, _ = io.Copy(c, r)
			return
		}
		if _, err := fmt.Fprintf(c, "%s %s\n", name, hostOf(c.RemoteAddr())); err != nil {
			return
		}
	}
}

// hostOf is a's address without port, an IPv4-mapped one as IPv4.
func hostOf(a net.Addr) string {
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return a.String()
	}
	return ap.Addr().Unmap().String()
}

// EchoConn is a TCP connection to an echo server, kept open to ask again
// (across a restart of the agent under test, say).
type EchoConn struct {
	net.Conn
	r       *bufio.Reader
	timeout time.Duration
}

// DialEcho connects from inside ns to the echo server at addr; timeout
// bounds the connect and every later answer.
func (ns *NS) DialEcho(addr string, timeout time.Duration) (*EchoConn, error) {
	var c net.Conn
	err := ns.Do(func() (err error) { c, err = net.DialTimeout("tcp", addr, timeout); return err })
	if err != nil {
		return nil, err
	}
	return &EchoConn{Conn: c, r: bufio.NewReader(c), timeout: timeout}, nil
}

// Ask asks the server again and returns its answer, "<name> <client>".
func (c *EchoConn) Ask() (string, error) {
	_ = c.SetDeadline(time.Now().Add(c.timeout))
	if _, err := io.WriteString(c, "ask\n"); err != nil {
		return "", err
	}
	line, err := c.r.ReadString('\n')
	return strings.TrimSpace(line), err
}

// Seen asks the server at which address it sees the client.
func (c *EchoConn) Seen() (string, error) {
	a, err := c.Ask()
	_, seen := SplitAnswer(a)
	return seen, err
}

// SplitAnswer splits an answer into the server's name and the client
// address it saw.
func SplitAnswer(answer string) (name, seen string) {
	name, seen, _ = strings.Cut(answer, " ")
	return name, seen
}

// Ask sends one question over network ("tcp" or "udp") from inside ns to
// the echo server at addr, on a new connection or in one datagram, and
// returns the answer; timeout bounds the connect and the answer each.
func (ns *NS) Ask(network, addr string, timeout time.Duration) (string, error) {
	var answer string
	err := ns.Do(func() error {
		c, err := net.DialTimeout(network, addr, timeout)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(timeout))
		if _, err := io.WriteString(c, "ask\n"); err != nil {
			return err
		}
		buf := make([]byte, 256)
		n, err := c.Read(buf)
		answer = strings.TrimSpace(string(buf[:n]))
		return err
	})
	return answer, err
}

// SeenTCP is the client address the echo server at addr sees on a new TCP
// connection from ns.
func (ns *NS) SeenTCP(addr string) (string, error) {
	a, err := ns.Ask("tcp", addr, EchoTimeout)
	_, seen := SplitAnswer(a)
	return seen, err
}

// SeenUDP is the client address the echo server at addr sees in a datagram
// from ns. It asks up to three times: a datagram may be lost while
// neighbours resolve.
func (ns *NS) SeenUDP(addr string) (string, error) {
	var err error
	for range 3 {
		var a string
		if a, err = ns.Ask("udp", addr, EchoTimeout/2); err == nil {
			_, seen := SplitAnswer(a)
			return seen, nil
		}
	}
	return "", fmt.Errorf("no UDP answer from %s: %w", addr, err)
}

// EchoBytes sends size random bytes to the echo server at addr from ns and
// checks that the same bytes come back: a transfer of size each way.
func (ns *NS) EchoBytes(addr string, size int) error {
	c, err := ns.DialEcho(addr, 10*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	data := make([]byte, size)
	_, _ = rand.Read(data)
	if _, err := io.WriteString(c, "echo\n"); err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write(data)
		if err == nil {
			err = c.Conn.(*net.TCPConn).CloseWrite()
		}
		errc <- err
	}()
	got, rerr := io.ReadAll(c.r)
	if err := errors.Join(<-errc, rerr); err != nil {
		return fmt.Errorf("after %d of %d bytes back: %w", len(got), size, err)
	}
	if !bytes.Equal(got, data) {
		return fmt.Errorf("%d bytes came back, not the %d sent", len(got), size)
	}
	return nil
}
