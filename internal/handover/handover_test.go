package handover

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

func socket(t *testing.T) string { return filepath.Join(t.TempDir(), "agent.sock") }

func TestDialFindsNoOne(t *testing.T) {
	missing := socket(t)
	stale := socket(t)
	ln, err := Listen(stale)
	if err != nil {
		t.Fatal(err)
	}
	ln.Close() // leaves the file, as an agent that exited does
	for name, path := range map[string]string{"no socket file": missing, "a stale socket file": stale} {
		p, err := Dial(path)
		if p != nil || err != nil {
			t.Errorf("%s: Dial = %v, %v; want no one", name, p, err)
		}
	}
}

func TestTakeOver(t *testing.T) {
	p, s := pair(t)
	select {
	case <-s.Taking():
		t.Fatal("taking before it asked")
	default:
	}
	took := make(chan error)
	go func() { took <- p.Take(context.Background()) }()
	<-s.Taking()
	select {
	case err := <-took:
		t.Fatalf("Take returned (%v) before the release", err)
	case <-time.After(50 * time.Millisecond):
	}
	if err := s.Release(&Parcels{}); err != nil {
		t.Fatal(err)
	}
	if err := <-took; err != nil {
		t.Fatalf("Take: %v", err)
	}
}

// The answers a successor may get to "take": each leaves the node to it,
// only a broken protocol is reported.
func TestTakeAnswers(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer func(c net.Conn)
		err    bool
	}{
		{"released", func(c net.Conn) { fmt.Fprintln(c, released) }, false},
		{"hung up", func(c net.Conn) { c.Close() }, false},
		{"something else", func(c net.Conn) { fmt.Fprintln(c, "no") }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := socket(t)
			l, err := net.Listen("unix", path)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			go func() {
				c, err := l.Accept()
				if err != nil {
					return
				}
				buf := make([]byte, len(hello+"\n"+take+"\n"))
				_, _ = c.Read(buf[:len(hello)+1])
				_, _ = c.Read(buf[len(hello)+1:])
				tc.answer(c)
			}()
			p, err := Dial(path)
			if err != nil || p == nil {
				t.Fatalf("Dial = %v, %v", p, err)
			}
			if err := p.Take(context.Background()); (err != nil) != tc.err {
				t.Fatalf("Take = %v, want an error: %v", err, tc.err)
			}
		})
	}
}

func TestSuccessorThatHangsUpIsGone(t *testing.T) {
	path := socket(t)
	ln, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	p, _ := Dial(path)
	s := <-ln.Successors()
	p.Close()
	select {
	case <-s.Gone():
	case <-s.Taking():
		t.Fatal("taking")
	case <-time.After(5 * time.Second):
		t.Fatal("not gone")
	}
	// The next successor is heard.
	p2, _ := Dial(path)
	defer p2.Close()
	select {
	case <-ln.Successors():
	case <-time.After(5 * time.Second):
		t.Fatal("second successor not heard")
	}
}

// The gate takes the node once every loop that joined waits, or left.
func TestGateTakesOnceEveryLoopWaits(t *testing.T) {
	for _, tc := range []struct {
		name            string
		join, wait, out int
		taken           bool
	}{
		{"all wait", 3, 3, 0, true},
		{"one still syncing", 3, 2, 0, false},
		{"one left", 3, 2, 1, true},
		{"none waits", 2, 0, 2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var takes atomic.Int32
			g := NewGate(taker(func() error { takes.Add(1); return nil }), func(error) {})
			g.Expect(tc.join)
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			passed := make(chan bool, tc.wait)
			for range tc.wait {
				go func() { passed <- g.Wait(ctx) }()
			}
			for range tc.out {
				g.Leave()
			}
			for range tc.wait {
				if got := <-passed; got != tc.taken {
					t.Fatalf("Wait = %v, want %v", got, tc.taken)
				}
			}
			if want := map[bool]int32{true: 1, false: 0}[tc.taken]; takes.Load() != want {
				t.Fatalf("took %d times, want %d", takes.Load(), want)
			}
		})
	}
}

func TestAFailedTakeStillOpens(t *testing.T) {
	var told error
	g := NewGate(taker(func() error { return errors.New("stuck") }), func(err error) { told = err })
	g.Expect(1)
	if !g.Wait(context.Background()) {
		t.Fatal("gate stayed shut")
	}
	if told == nil {
		t.Fatal("the failure was not told")
	}
	if f, err := g.Claim(context.Background(), "wireguard"); len(f) != 0 || err != nil {
		t.Fatalf("Claim after a failed take = %v, %v; want nothing", f, err)
	}
}

// taker is a running agent whose take is fn and which keeps no parcel.
type taker func() error

func (t taker) Take(context.Context) error { return t() }
func (t taker) Claim(context.Context, string) ([]*os.File, error) {
	panic("claimed from an agent that did not release the node")
}
