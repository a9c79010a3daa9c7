package wireguard

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/conn"

	"github.com/netplane/netplane/e2e/netns"
)

// received is what a bind's receive functions hand wireguard-go.
type received struct {
	p  []byte
	ep conn.Endpoint
}

// openIn opens b on port inside ns, where its sockets then belong, and
// sends what its receive functions return to out until it closes.
func openIn(t *testing.T, ns *netns.NS, b *portBind, port uint16, out chan<- received) uint16 {
	t.Helper()
	var fns []conn.ReceiveFunc
	var actual uint16
	if err := ns.Do(func() (err error) { fns, actual, err = b.Open(port); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	for _, fn := range fns {
		go func() {
			bufs, sizes, eps := make([][]byte, conn.IdealBatchSize), make([]int, conn.IdealBatchSize), make([]conn.Endpoint, conn.IdealBatchSize)
			for i := range bufs {
				bufs[i] = make([]byte, 1<<16-1)
			}
			for {
				n, err := fn(bufs, sizes, eps)
				if err != nil {
					return
				}
				for i := range n {
					out <- received{p: bytes.Clone(bufs[i][:sizes[i]]), ep: eps[i]}
				}
			}
		}()
	}
	return actual
}

func expect(t *testing.T, from <-chan received, want [][]byte, src string) {
	t.Helper()
	for i, w := range want {
		select {
		case r := <-from:
			if !bytes.Equal(r.p, w) {
				t.Fatalf("datagram %d: got %d bytes starting %x, want %d starting %x", i, len(r.p), r.p[:min(len(r.p), 4)], len(w), w[:min(len(w), 4)])
			}
			if src != "" && r.ep.DstToString() != src {
				t.Fatalf("datagram %d came from %s, want %s", i, r.ep.DstToString(), src)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("got %d datagrams of %d", i, len(want))
		}
	}
	select {
	case r := <-from:
		t.Fatalf("one more datagram than sent: %d bytes", len(r.p))
	case <-time.After(20 * time.Millisecond):
	}
}

// datagrams are numbered datagrams of sizes.
func datagrams(first int, sizes ...int) [][]byte {
	out := make([][]byte, len(sizes))
	for i, n := range sizes {
		p := bytes.Repeat([]byte{byte(first + i)}, n)
		p[0], p[1] = byte((first+i)>>8), byte(first+i)
		out[i] = p
	}
	return out
}

func repeat(n, size int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = size
	}
	return out
}

// The kernel joins runs of one size on the way out and in (GSO, GRO):
// every datagram must come out as it went in, in order, from its sender.
func TestPortBindCarriesBatchesIntact(t *testing.T) {
	ns := netns.New(t, "portbind")
	for _, family := range []string{"127.0.0.1", "::1"} {
		from, to := newPortBind(), newPortBind()
		got := make(chan received, 1024)
		fromPort := openIn(t, ns, from, 0, make(chan received, 1))
		toPort := openIn(t, ns, to, 0, got)
		dst, _ := to.ParseEndpoint(netip.AddrPortFrom(netip.MustParseAddr(family), toPort).String())
		src := netip.AddrPortFrom(netip.MustParseAddr(family), fromPort).String()
		for _, c := range []struct {
			name  string
			sizes []int
		}{
			{"a full batch of one size", repeat(conn.IdealBatchSize, 1452)},
			{"a run ending shorter", append(repeat(10, 1000), 300)},
			{"sizes that change", []int{1000, 1200, 1200, 50, 1400, 1400, 1400, 32}},
			{"one", []int{148}},
			{"runs past the joined size", repeat(100, 9000)},
		} {
			t.Run(family+"/"+c.name, func(t *testing.T) {
				want := datagrams(1, c.sizes...)
				if err := from.Send(want, dst); err != nil {
					t.Fatal(err)
				}
				expect(t, got, want, src)
			})
		}
	}
}

// A port handed on never closes: what comes while no agent reads it is
// read by the next one; a port that closes and is bound again loses it.
func TestAHandedPortKeepsWhatCameMeanwhile(t *testing.T) {
	ns := netns.New(t, "handedport")
	old, next := newPortBind(), newPortBind()
	fromOld, fromNext := make(chan received, 64), make(chan received, 64)
	port := openIn(t, ns, old, 0, fromOld)

	var peer *net.UDPConn
	if err := ns.Do(func() (err error) {
		peer, err = net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	send := func(ps [][]byte) {
		for _, p := range ps {
			if _, err := peer.Write(p); err != nil {
				t.Fatal(err)
			}
		}
	}
	before, meanwhile := datagrams(1, repeat(5, 200)...), datagrams(6, repeat(5, 200)...)
	send(before)
	expect(t, fromOld, before, "")

	files, err := old.files()
	if err != nil {
		t.Fatal(err)
	}
	next.adopt(files)
	old.Close()
	send(meanwhile)
	if got := openIn(t, ns, next, port, fromNext); got != port {
		t.Fatalf("the next bind opened port %d, want the handed %d", got, port)
	}
	expect(t, fromNext, meanwhile, "")
}

// Sockets handed over on another port than asked for are let go of.
func TestAHandedPortOnAnotherPortIsClosed(t *testing.T) {
	ns := netns.New(t, "otherport")
	old, next := newPortBind(), newPortBind()
	port := openIn(t, ns, old, 0, make(chan received, 1))
	files, err := old.files()
	if err != nil {
		t.Fatal(err)
	}
	old.Close()
	next.adopt(files)
	if got := openIn(t, ns, next, port+1, make(chan received, 1)); got != port+1 {
		t.Fatalf("opened port %d, want %d", got, port+1)
	}
	if err := ns.Do(func() error {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{Port: int(port)})
		if err != nil {
			return fmt.Errorf("port %d still held: %w", port, err)
		}
		return c.Close()
	}); err != nil {
		t.Fatal(err)
	}
}
