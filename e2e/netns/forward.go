package netns

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Listen opens a TCP listener inside the namespace.
func (ns *NS) Listen(addr string) (net.Listener, error) {
	var l net.Listener
	err := ns.Do(func() error {
		var err error
		l, err = net.Listen("tcp", addr)
		return err
	})
	return l, err
}

// Dial opens a TCP connection from inside the namespace.
func (ns *NS) Dial(network, addr string) (net.Conn, error) {
	var c net.Conn
	err := ns.Do(func() error {
		var err error
		c, err = net.Dial(network, addr)
		return err
	})
	return c, err
}

// Forward listens on listenAddr inside the namespace and relays every
// connection to target as dialled from the test process's own namespace. It
// lets a process in a test namespace reach a server on the machine's
// loopback (the test API server) without any route or interface in the root
// namespace. It returns the bound address and stops when the test ends.
func (ns *NS) Forward(t testing.TB, listenAddr, target string) string {
	t.Helper()
	l, err := ns.Listen(listenAddr)
	if err != nil {
		t.Fatal(err)
	}
	stop := relay(l, func() (net.Conn, error) { return net.Dial("tcp", target) }, nil)
	t.Cleanup(stop)
	return l.Addr().String()
}

// ForwardCounted is Forward that adds to received every byte the target
// sends back: what a process in the namespace receives from the server.
func (ns *NS) ForwardCounted(t testing.TB, listenAddr, target string, received *atomic.Int64) string {
	t.Helper()
	l, err := ns.Listen(listenAddr)
	if err != nil {
		t.Fatal(err)
	}
	stop := relay(l, func() (net.Conn, error) { return net.Dial("tcp", target) }, received)
	t.Cleanup(stop)
	return l.Addr().String()
}

// Relay accepts on l and copies each connection to one made by dial, until
// the returned stop function is called.
func Relay(l net.Listener, dial func() (net.Conn, error)) (stop func()) { return relay(l, dial, nil) }

// relay is Relay, counting the bytes dial's side sends in received if set.
func relay(l net.Listener, dial func() (net.Conn, error), received *atomic.Int64) (stop func()) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	conns := map[net.Conn]bool{}
	track := func(c net.Conn, on bool) {
		mu.Lock()
		defer mu.Unlock()
		if on {
			conns[c] = true
		} else {
			delete(conns, c)
		}
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			in, err := l.Accept()
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				out, err := dial()
				if err != nil {
					in.Close()
					return
				}
				track(in, true)
				track(out, true)
				done := make(chan struct{}, 2)
				go func() { io.Copy(out, in); done <- struct{}{} }()
				go func() {
					var from io.Reader = out
					if received != nil {
						from = countingReader{out, received}
					}
					io.Copy(in, from)
					done <- struct{}{}
				}()
				<-done
				in.Close()
				out.Close()
				<-done
				track(in, false)
				track(out, false)
			}()
		}
	}()
	return func() {
		l.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}
}

// countingReader counts what is read through it.
type countingReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// Connects times n TCP connects from the namespace to addr, each until it
// is established, one after another.
func (ns *NS) Connects(addr string, n int) ([]time.Duration, error) {
	out := make([]time.Duration, 0, n)
	err := ns.Do(func() error {
		for range n {
			t0 := time.Now()
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if err != nil {
				return err
			}
			out = append(out, time.Since(t0))
			c.Close()
		}
		return nil
	})
	return out, err
}
