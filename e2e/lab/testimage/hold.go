package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// HeldResult is one long-lived connection: kept if every request on it was
// answered and it was never dialled again. Ended says how each connection
// that had to be dialled again ended.
type HeldResult struct {
	Target   string   `json:"target"`
	Requests int64    `json:"requests"`
	Dials    int64    `json:"dials"`
	Kept     bool     `json:"kept"`
	Error    string   `json:"error,omitempty"`
	Ended    []string `json:"ended,omitempty"`
}

// held is one HTTP/1.1 connection to url that the load keeps open, with a
// GET on it every interval.
//
// It writes each request and reads each answer on the connection itself
// instead of through net/http's Transport: the Transport does not reuse a
// connection whose request write it has not seen finish within 50 ms of
// reading the answer (maxWriteWaitBeforeConnReuse), and dials a new one
// without an error. On a 2-core machine at a load average of 30 that
// happened to held connections every few seconds with nothing touching the
// network, which read as connections the network had broken. Here a new
// connection is dialled only after the old one failed, and why it failed
// is recorded.
type held struct {
	url      string
	interval time.Duration
	timeout  time.Duration // of one dial, and of one request and its answer
	dial     func(ctx context.Context, network, addr string) (net.Conn, error)
}

// run sends the requests until ctx ends; answered is called on the first
// answer.
func (h held) run(ctx context.Context, answered func()) HeldResult {
	r := HeldResult{Target: h.url}
	fail := func(err error) {
		if r.Error == "" {
			r.Error = time.Now().Format("15:04:05.000 ") + err.Error()
		}
	}
	req, addr, err := heldRequest(h.url)
	if err != nil {
		fail(err)
		return r
	}
	tick := time.NewTicker(h.interval)
	defer tick.Stop()
	var c *heldConn
	defer func() {
		if c != nil {
			c.Close()
		}
	}()
	for {
		if c == nil {
			r.Dials++
			conn, err := h.dial(ctx, "tcp", addr)
			if err != nil {
				fail(fmt.Errorf("dial: %w", err))
			} else {
				c = &heldConn{Conn: conn, br: bufio.NewReader(conn), dialled: time.Now()}
			}
		}
		if c != nil {
			err := c.exchange(req, h.timeout)
			if r.Requests++; r.Requests == 1 && err == nil {
				answered()
			}
			if err != nil {
				fail(err)
				r.Ended = append(r.Ended, fmt.Sprintf("%s dialled %s, ended %s %v",
					c.LocalAddr(), c.dialled.Format("15:04:05.000"), time.Now().Format("15:04:05.000"), err))
				c.Close()
				c = nil
			}
		}
		select {
		case <-ctx.Done():
			r.Kept = r.Error == "" && r.Dials == 1
			return r
		case <-tick.C:
		}
	}
}

// heldRequest is the GET of an http:// URL and the address to dial.
func heldRequest(u string) (*http.Request, string, error) {
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		return nil, "", err
	}
	if req.URL.Scheme != "http" {
		return nil, "", fmt.Errorf("%s: only http:// is held", u)
	}
	addr := req.URL.Host
	if req.URL.Port() == "" {
		addr = net.JoinHostPort(req.URL.Hostname(), "80")
	}
	return req, addr, nil
}

// heldConn is one connection of a held target.
type heldConn struct {
	net.Conn
	br      *bufio.Reader
	dialled time.Time
}

// exchange writes req and reads its whole answer within timeout. Any
// failure ends the connection: an error, a status other than 200, or the
// server saying it closes the connection.
func (c *heldConn) exchange(req *http.Request, timeout time.Duration) error {
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	if err := req.Write(c); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	resp, err := http.ReadResponse(c.br, req)
	if err != nil {
		return fmt.Errorf("read: %w", err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return fmt.Errorf("read body: %w", err)
	}
	switch {
	case resp.StatusCode != http.StatusOK:
		return errors.New(resp.Status)
	case resp.Close:
		return errors.New("the server closes the connection")
	}
	return nil
}
