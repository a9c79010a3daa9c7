package listen

import (
	"net"
	"testing"
)

// Two listeners share a port, as the node agent and its successor do;
// without SO_REUSEPORT the second bind fails.
func TestTwoListenersShareAPort(t *testing.T) {
	a, err := Shared("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Shared("tcp", a.Addr().String())
	if err != nil {
		t.Fatalf("second listener on %s: %v", a.Addr(), err)
	}
	b.Close()
	if l, err := net.Listen("tcp", a.Addr().String()); err == nil {
		l.Close()
		t.Fatal("a plain listener took the shared port: the test proves nothing")
	}
}
