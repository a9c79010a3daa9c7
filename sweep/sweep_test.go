package sweep

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/vishvananda/netlink"
)

func TestReportSaysWhatWentWhatStayedAndWhatFailed(t *testing.T) {
	for _, tc := range []struct {
		name string
		do   func(s *Sweep)
		want string
	}{
		{"nothing there", func(*Sweep) {}, "nothing to remove\n"},
		{"removed and kept", func(s *Sweep) {
			s.Note("table inet netplane-pods", nil)
			s.Keep("link cni0", "a veth, not netplane's bridge")
		}, "removed table inet netplane-pods\nkept link cni0: a veth, not netplane's bridge\n"},
		{"a failure is no nothing", func(s *Sweep) {
			s.Note("link netplane.wg", errors.New("operation not permitted"))
		}, "could not remove link netplane.wg: operation not permitted\n"},
		{"kept only is nothing removed", func(s *Sweep) {
			s.Keep("IPAM store /var/lib/netplane/ipam", "kept as asked")
		}, "kept IPAM store /var/lib/netplane/ipam: kept as asked\nnothing to remove\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s Sweep
			tc.do(&s)
			var b bytes.Buffer
			s.Report(&b)
			if b.String() != tc.want {
				t.Errorf("report:\n%s\nwant:\n%s", b.String(), tc.want)
			}
		})
	}
}

func TestFilesAndFoldersGoOnlyWhenThereAndOurs(t *testing.T) {
	dir := t.TempDir()
	mine, theirs := filepath.Join(dir, "state", "lock"), filepath.Join(dir, "shared", "other")
	for _, p := range []string{mine, theirs} {
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, nil, 0o600)
	}
	var s Sweep
	s.File(mine)
	s.Dir(filepath.Dir(mine))
	s.Dir(filepath.Dir(theirs))
	s.File(filepath.Join(dir, "missing"))
	s.Dir(filepath.Join(dir, "missing"))
	want := []string{"file " + mine, "folder " + filepath.Dir(mine)}
	if got := s.Removed(); len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("removed %q, want %q", got, want)
	}
	if got := s.Kept(); len(got) != 1 || got[0] != "folder "+filepath.Dir(theirs)+": it holds files netplane did not make" {
		t.Errorf("kept %q", got)
	}
	if _, err := os.Stat(theirs); err != nil || s.Err() != nil {
		t.Errorf("another's file: %v; errors: %v", err, s.Err())
	}
}

// links is a namespace's links by name.
type links map[string]netlink.Link

func (l links) LinkByName(name string) (netlink.Link, error) {
	if k, ok := l[name]; ok {
		return k, nil
	}
	return nil, netlink.LinkNotFoundError{}
}

func (l links) LinkDel(k netlink.Link) error {
	delete(l, k.Attrs().Name)
	return nil
}

func TestALinkOfAnotherKindIsKept(t *testing.T) {
	attrs := func(name string) netlink.LinkAttrs { return netlink.LinkAttrs{Name: name} }
	for _, tc := range []struct {
		name, kind string
		have       netlink.Link
		removed    bool
		kept       string
	}{
		{name: "cni0", kind: "bridge", have: &netlink.Bridge{LinkAttrs: attrs("cni0")}, removed: true},
		{name: "cni0", kind: "bridge", have: &netlink.Dummy{LinkAttrs: attrs("cni0")}, kept: "link cni0: a dummy, not netplane's bridge"},
		{name: "netplane.wg", have: &netlink.Tuntap{LinkAttrs: attrs("netplane.wg")}, removed: true},
		{name: "netplane.wg"},
	} {
		var s Sweep
		l := links{}
		if tc.have != nil {
			l[tc.name] = tc.have
		}
		s.Link(l, tc.name, tc.kind)
		_, left := l[tc.name]
		wantLeft, wantRemoved := tc.kept != "", 0
		if tc.removed {
			wantRemoved = 1
		}
		if left != wantLeft || len(s.Removed()) != wantRemoved {
			t.Errorf("%s (%v): removed %q, still there %v", tc.name, tc.have, s.Removed(), left)
		}
		if kept := s.Kept(); (tc.kept == "") != (len(kept) == 0) || (len(kept) > 0 && kept[0] != tc.kept) {
			t.Errorf("%s: kept %q, want %q", tc.name, kept, tc.kept)
		}
	}
}
