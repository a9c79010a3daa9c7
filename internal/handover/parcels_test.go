package handover

import (
	"context"
	"errors"
	"os"
	"strconv"
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

func (p *pipeParcel) Hand() ([]*os.File, error) {
	p.handed++
	if p.handErr != nil {
		return nil, p.handErr
	}
	// Twice the same file: a parcel may carry several, in order.
	dup, err := os.OpenFile("/proc/self/fd/"+strconv.Itoa(int(p.w.Fd())), os.O_WRONLY, 0)
	if err != nil {
		return nil, err
	}
	return []*os.File{p.w, dup}, nil
}

// releasing is a parcel that serves on after it was handed over, until
// release is closed.
type releasing struct {
	pipeParcel
	release chan struct{}
}

func (r *releasing) Released() <-chan struct{} { return r.release }

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
			fs, err := p.Claim(ctx, tc.claim)
			if (err != nil) != tc.err || (len(fs) == 2) != tc.handed || (!tc.handed && len(fs) != 0) {
				t.Fatalf("Claim(%q) = %v, %v; want two files %v, an error %v", tc.claim, fs, err, tc.handed, tc.err)
			}
			if len(fs) == 0 {
				return
			}
			for i, f := range fs {
				defer f.Close()
				word := "through" + strconv.Itoa(i)
				if _, err := f.Write([]byte(word)); err != nil {
					t.Fatal(err)
				}
				buf := make([]byte, 16)
				n, _ := r.Read(buf)
				if string(buf[:n]) != word {
					t.Fatalf("read %q at the kept file's other end; want %q, written into file %d handed over", buf[:n], word, i)
				}
			}
			// Handed over once: a second claim finds nothing, and the
			// predecessor's exit stops nothing more.
			if f2, err := p.Claim(ctx, tc.claim); len(f2) != 0 || err != nil {
				t.Fatalf("second Claim = %v, %v; want nothing", f2, err)
			}
			ps.Close()
			if pp.handed != 1 || pp.closed != 0 {
				t.Fatalf("handed %d, closed %d times; want 1, 0", pp.handed, pp.closed)
			}
		})
	}
}

// A parcel that serves on after it was handed over stays in the keeping
// until it is released: an agent told to stop waits for it.
func TestAReleaserIsKeptUntilReleased(t *testing.T) {
	_, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	rp := &releasing{pipeParcel: pipeParcel{w: w}, release: make(chan struct{})}
	ps := &Parcels{}
	ps.Keep("wireguard", rp)
	p := releasedWith(t, ps)
	fs, err := p.Claim(context.Background(), "wireguard")
	if err != nil || len(fs) != 2 {
		t.Fatalf("Claim = %v, %v; want two files", fs, err)
	}
	for _, f := range fs {
		f.Close()
	}
	select {
	case <-ps.Claimed():
		t.Fatal("claimed before the parcel was released")
	default:
	}
	close(rp.release)
	<-ps.Claimed()
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
	if f, err := p.Claim(context.Background(), "wireguard"); len(f) != 0 || err != nil {
		t.Fatalf("Claim = %v, %v; want nothing", f, err)
	}
}
