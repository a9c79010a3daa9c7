package handover

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// A data path that runs in the agent's process (wireguard-go on its TUN
// device) would stop for the time between the predecessor's release and
// the successor's first sync. So a feature does not close such a thing
// when it stops: it leaves it running in the agent's Parcels, and the
// agent hands it over when the successor claims it by name:
//
//	successor                          predecessor (idle, its data path running)
//	"claim wireguard"      ───────▶    hands it over
//	                       ◀───────    "parcel wireguard" with its files (SCM_RIGHTS)
//
// A TUN device whose file stays open queues what is routed into it instead
// of dropping it, so the successor reads what came meanwhile; the files
// may carry more than the device (wireguard's relay of its sessions). A successor
// that claims nothing (it runs without that feature) leaves the data path
// running until the predecessor exits: peers that still send through it
// are served while they follow the change.

// Parcel is a data path a stopped feature left running. Hand gives it up
// and returns the files that carry it on (the caller's to close); Close
// stops it for good. An alias, so that role.Keeper names the same type
// without either package importing the other.
type Parcel = interface {
	Hand() ([]*os.File, error)
	Close() error
}

// Releaser is a Parcel that goes on serving for a while after it was
// handed over (wireguard's sessions): Released is closed when it is done,
// and only then is it gone from the agent's keeping (Parcels.Claimed).
type Releaser interface {
	Released() <-chan struct{}
}

// Parcels are the data paths in an agent's keeping, by name.
type Parcels struct {
	mu      sync.Mutex
	kept    map[string]Parcel
	emptied chan struct{} // closed when the last one kept is handed over or closed
}

// Claimed is closed once nothing is kept any more (each parcel handed over
// and sent, and released, or closed): what an agent that stops right after letting go
// waits for, so that a successor's claim does not find its data path
// stopped.
func (ps *Parcels) Claimed() <-chan struct{} {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if len(ps.kept) == 0 {
		return closed
	}
	return ps.emptied
}

var closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Keep takes p into the agent's keeping under name; one kept there before
// under that name is closed.
func (ps *Parcels) Keep(name string, p Parcel) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if len(ps.kept) == 0 {
		ps.kept, ps.emptied = map[string]Parcel{}, make(chan struct{})
	}
	if old := ps.kept[name]; old != nil {
		old.Close()
	}
	ps.kept[name] = p
}

// take removes the parcel name from the keeping; nil when none is kept.
// Call gone once what was taken is dealt with.
func (ps *Parcels) take(name string) Parcel {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.kept[name]
}

// gone drops name from the keeping, closing Claimed when it was the last.
func (ps *Parcels) gone(name string) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if _, ok := ps.kept[name]; !ok {
		return
	}
	delete(ps.kept, name)
	if len(ps.kept) == 0 {
		close(ps.emptied)
	}
}

// Close stops every parcel kept: the agent is exiting.
func (ps *Parcels) Close() error {
	ps.mu.Lock()
	kept := maps.Clone(ps.kept)
	ps.mu.Unlock()
	var errs []error
	for name, p := range kept {
		if err := p.Close(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
		ps.gone(name)
	}
	return errors.Join(errs...)
}

// The claim protocol's lines.
const (
	claim  = "claim"
	parcel = "parcel"
	none   = "none"
)

// serveClaims answers the successor's claims on conn from ps until it
// hangs up.
func serveClaims(conn *net.UnixConn, ps *Parcels) {
	defer conn.Close()
	buf := make([]byte, 256)
	for {
		n, err := conn.Read(buf)
		if err != nil {
			return
		}
		verb, name, _ := strings.Cut(strings.TrimSpace(string(buf[:n])), " ")
		if verb != claim || name == "" {
			return
		}
		if err := handTo(conn, ps, name); err != nil {
			return
		}
	}
}

// handTo hands the parcel name over and sends its files on conn, or says
// there is none; only then (and once a Releaser is released) is it gone
// from ps.
func handTo(conn *net.UnixConn, ps *Parcels, name string) error {
	var fs []*os.File
	p := ps.take(name)
	if p != nil {
		fs, _ = p.Hand()
		if r, ok := p.(Releaser); ok && len(fs) > 0 {
			go func() { <-r.Released(); ps.gone(name) }()
		} else {
			defer ps.gone(name)
		}
	}
	if len(fs) == 0 {
		// Without its file the successor opens the device anew.
		_, err := fmt.Fprintf(conn, "%s %s\n", none, name)
		return err
	}
	fds := make([]int, len(fs))
	for i, f := range fs {
		defer f.Close()
		fds[i] = int(f.Fd())
	}
	_, _, err := conn.WriteMsgUnix([]byte(parcel+" "+name+"\n"), unix.UnixRights(fds...), nil)
	return err
}

// maxFiles is how many files a parcel may carry.
const maxFiles = 4

// claimFrom asks the predecessor on conn for its parcel name: its files,
// or none when it has none.
func claimFrom(conn *net.UnixConn, name string) ([]*os.File, error) {
	if _, err := fmt.Fprintf(conn, "%s %s\n", claim, name); err != nil {
		return nil, err
	}
	buf, oob := make([]byte, 256), make([]byte, unix.CmsgSpace(4*maxFiles))
	n, oobn, _, _, err := conn.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	if msgs, perr := unix.ParseSocketControlMessage(oob[:oobn]); perr == nil {
		for _, m := range msgs {
			if rights, rerr := unix.ParseUnixRights(&m); rerr == nil {
				fds = append(fds, rights...)
			}
		}
	}
	line := strings.TrimSpace(string(buf[:n]))
	switch {
	case line == parcel+" "+name && len(fds) > 0:
		fs := make([]*os.File, len(fds))
		for i, fd := range fds {
			unix.CloseOnExec(fd)
			fs[i] = os.NewFile(uintptr(fd), name)
		}
		return fs, nil
	case line == none+" "+name && len(fds) == 0:
		return nil, nil
	}
	for _, fd := range fds {
		unix.Close(fd)
	}
	return nil, fmt.Errorf("the running agent answered %q with %d files to %q", line, len(fds), claim+" "+name)
}
