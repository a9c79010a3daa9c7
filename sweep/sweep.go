// Package sweep removes what the node role made on a node, for
// `netplane --role=node --cleanup`. Each feature names its own objects to
// one Sweep (nftables tables, links, files; routes and rules it removes
// itself and notes); the Sweep removes each one that is there and keeps
// the account of what went, what was left on purpose and what could not
// be removed. A missing object is not an error, so a second sweep is a
// no-op; nothing is removed by pattern, only by the names the features
// own, so what others made stays.
package sweep

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/netplane/netplane/nft"
)

// Sweep is the account of one cleanup. The zero value is ready.
type Sweep struct {
	// NFT is the namespace tables are removed from; zero: the caller's.
	NFT nft.Dialer

	removed []string
	kept    []string
	failed  []error
}

// Removed lists what was removed, in order ("table inet netplane-pods").
func (s *Sweep) Removed() []string { return s.removed }

// Kept lists what was found but left, each with why.
func (s *Sweep) Kept() []string { return s.kept }

// Err is what could not be removed, one error each; nil when nothing of
// the node role's remains.
func (s *Sweep) Err() error { return errors.Join(s.failed...) }

// Note records the removal of what, done by the caller: removed when err
// is nil, else left and failed.
func (s *Sweep) Note(what string, err error) {
	if err != nil {
		s.failed = append(s.failed, fmt.Errorf("%s: %w", what, err))
		return
	}
	s.removed = append(s.removed, what)
}

// Keep records something found and left on purpose, and why.
func (s *Sweep) Keep(what, why string) { s.kept = append(s.kept, what+": "+why) }

// Table removes the nftables table id if the kernel has it.
func (s *Sweep) Table(id nft.TableID) {
	what := "table " + id.String()
	there, err := nft.Exists(s.NFT, id)
	if err != nil {
		s.Note(what, err)
		return
	}
	if there {
		s.Note(what, nft.Delete(s.NFT, id))
	}
}

// Links is what Link needs of a netlink handle.
type Links interface {
	LinkByName(name string) (netlink.Link, error)
	LinkDel(l netlink.Link) error
}

// Link removes the interface name if it exists and, unless kind is "",
// is of that kind (netlink's Type: "bridge"); one of another kind is not
// the node role's and is kept.
func (s *Sweep) Link(h Links, name, kind string) {
	l, err := h.LinkByName(name)
	if linkMissing(err) {
		return
	}
	what := "link " + name
	if err != nil {
		s.Note(what, err)
		return
	}
	if kind != "" && l.Type() != kind {
		s.Keep(what, fmt.Sprintf("a %s, not netplane's %s", l.Type(), kind))
		return
	}
	if err := h.LinkDel(l); err != nil && !linkMissing(err) {
		s.Note(what, err)
		return
	}
	s.Note(what, nil)
}

func linkMissing(err error) bool {
	var notFound netlink.LinkNotFoundError
	return errors.As(err, &notFound) || errors.Is(err, unix.ENODEV)
}

// File removes the file path if it is there.
func (s *Sweep) File(path string) {
	if err := os.Remove(path); !errors.Is(err, fs.ErrNotExist) {
		s.Note("file "+path, err)
	}
}

// Dir removes the folder path if it is there and empty: one still
// holding files is kept, as they are not the node role's.
func (s *Sweep) Dir(path string) {
	err := os.Remove(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST):
		s.Keep("folder "+path, "it holds files netplane did not make")
	default:
		s.Note("folder "+path, err)
	}
}

// Report writes one line per object removed, kept or left by a failure,
// and a line saying so when there was nothing to remove.
func (s *Sweep) Report(w io.Writer) {
	for _, r := range s.removed {
		fmt.Fprintln(w, "removed", r)
	}
	for _, k := range s.kept {
		fmt.Fprintln(w, "kept", k)
	}
	for _, err := range s.failed {
		fmt.Fprintln(w, "could not remove", err)
	}
	if len(s.removed)+len(s.failed) == 0 {
		fmt.Fprintln(w, "nothing to remove")
	}
}
