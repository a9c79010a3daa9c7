package handover

import (
	"context"
	"errors"
	"os"
	"testing"
)

// pipeParcel is a data path whose file is a pipe's write end: what the
// successor writes into the file handed over, the test reads at the other
// end, so the file is shown to be the same open file, not a copy.
type pipeParcel struct {
	w              *os.File
	handed, closed int
	handErr        error
}

func (p *pipeParcel) Hand() (*os.File, error) {
	p.handed++
	if p.handErr != nil {
		return nil, p.handErr
	}
	return p.w, nil
}

func (p *pipeParcel) Close() error { p.closed++; return p.w.Close() }

// pair is a successor dialled to a predecessor listening on a real socket.
func pair(t *testing.T) (*Predecessor, *Successor) {
	t.Helper()
	path := socket(t)
	ln, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	p, err := Dial(path)
	if err != nil || p == nil {
		t.Fatalf("Dial = %v, %v", p, err)
	}
	t.Cleanup(func() { p.Close() })
	return p, <-ln.Successors()
}

// releasedWith is a take, released with ps kept.
func releasedWith(t *testing.T, ps *Parcels) *Predecessor {
	t.Helper()
	p, s := pair(t)
	took := make(chan error)
	go func() { took <- p.Take(context.Background()) }()
	<-s.Taking()
	if err := s.Release(ps); err != nil {
		t.Fatal(err)
	}
	if err := <-took; err != nil {
		t.Fatal(err)
	}
	return p
}

func TestClaims(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		kept    bool
		handErr error
		claim   string
		handed  bool // the file arrives
		err     bool
	}{
		{"kept", true, nil, "wireguard", true, false},
		{"kept under another name", true, nil, "other", false, false},
		{"nothing kept", false, nil, "wireguard", false, false},
		{"stopping it failed", true, errors.New("busy"), "wireguard", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			pp := &pipeParcel{w: w, handErr: tc.handErr}
			ps := &Parcels{}
			if tc.kept {
				ps.Keep("wireguard", pp)
			}
			p := releasedWith(t, ps)
			f, err := p.Claim(ctx, tc.claim)
			if (err != nil) != tc.err || (f != nil) != tc.handed {
				t.Fatalf("Claim(%q) = %v, %v; want a file %v, an error %v", tc.claim, f, err, tc.handed, tc.err)
			}
			if f == nil {
				return
			}
			defer f.Close()
			if _, err := f.Write([]byte("through")); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 16)
			n, _ := r.Read(buf)
			if string(buf[:n]) != "through" {
				t.Fatalf("read %q at the kept file's other end; want what was written into the file handed over", buf[:n])
			}
			// Handed over once: a second claim finds nothing, and the
			// predecessor's exit stops nothing more.
			if f2, err := p.Claim(ctx, tc.claim); f2 != nil || err != nil {
				t.Fatalf("second Claim = %v, %v; want nothing", f2, err)
			}
			ps.Close()
			if pp.handed != 1 || pp.closed != 0 {
				t.Fatalf("handed %d, closed %d times; want 1, 0", pp.handed, pp.closed)
			}
		})
	}
}

// What the successor does not claim runs until the predecessor exits.
func TestUnclaimedParcelsCloseWithTheAgent(t *testing.T) {
	_, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	pp := &pipeParcel{w: w}
	ps := &Parcels{}
	ps.Keep("wireguard", pp)
	releasedWith(t, ps)
	if pp.closed != 0 {
		t.Fatal("closed before the agent exits")
	}
	if err := ps.Close(); err != nil {
		t.Fatal(err)
	}
	if pp.closed != 1 || pp.handed != 0 {
		t.Fatalf("handed %d, closed %d times; want 0, 1", pp.handed, pp.closed)
	}
}

// A predecessor that went away after the release keeps nothing.
func TestClaimFromAGonePredecessor(t *testing.T) {
	p, s := pair(t)
	go func() { <-s.Taking(); s.Release(&Parcels{}); s.Drop() }()
	if err := p.Take(context.Background()); err != nil {
		t.Fatal(err)
	}
	if f, err := p.Claim(context.Background(), "wireguard"); f != nil || err != nil {
		t.Fatalf("Claim = %v, %v; want nothing", f, err)
	}
}
