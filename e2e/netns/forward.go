package netns

import (
	"errors"
	"io"
	"net"
	"sync"
	"testing"
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
	stop := Relay(l, func() (net.Conn, error) { return net.Dial("tcp", target) })
	t.Cleanup(stop)
	return l.Addr().String()
}

// Relay accepts on l and copies each connection to one made by dial, until
// the returned stop function is called.
func Relay(l net.Listener, dial func() (net.Conn, error)) (stop func()) {
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
				go func() { io.Copy(in, out); done <- struct{}{} }()
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
