package framework

import (
	"net"
	"testing"
)

// Serve accepts connections on l until the test ends, when l is closed,
// and runs handle on each in a goroutine of its own; the connection is
// closed when handle returns.
func Serve(t testing.TB, l net.Listener, handle func(net.Conn)) {
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
}
