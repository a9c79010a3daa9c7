package ipam

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// File names inside the state directory: the table of a boot is
// allocations.<boot ID>.json.
const (
	statePrefix = "allocations."
	stateSuffix = ".json"
	lockFile    = "lock"
)

// BootIDPath is where the kernel tells which boot this is.
const BootIDPath = "/proc/sys/kernel/random/boot_id"

// Store is the on-disk State of one node, in a directory of its own. Every
// change is one atomic replace of the table (write a temporary file, then
// rename it over the old one), so a plugin killed at any point leaves
// either the old or the new table, never a torn one. An exclusive flock on
// the directory's lock file serialises the plugin processes.
//
// The table is named after the kernel's boot ID, and that is why there is no
// fsync (which costs milliseconds on every pod start): unsynced data is only
// lost by a kernel crash or power loss, that is, with the boot, and every
// record of an earlier boot is void anyway, since its pods' network
// namespaces are gone. A torn table can therefore only carry another boot's
// ID; it is never read as the current table. Within one boot the page cache
// makes each rename visible to every process at once.
type Store struct {
	Dir string
	// BootID is the current boot; records of another boot are dropped on load.
	BootID string
}

// NewStore returns the store in dir for the running kernel's boot.
func NewStore(dir string) (*Store, error) {
	b, err := os.ReadFile(BootIDPath)
	if err != nil {
		return nil, fmt.Errorf("read boot ID: %w", err)
	}
	return &Store{Dir: dir, BootID: strings.TrimSpace(string(b))}, nil
}

// Update locks the store, loads the state, lets fn change it and writes it
// back when fn succeeds and changed something. fn's error is returned as is.
func (s *Store) Update(fn func(*State) error) error {
	unlock, err := s.lock(unix.LOCK_EX)
	if err != nil {
		return err
	}
	defer unlock()
	st, raw, err := s.load()
	if err != nil {
		return err
	}
	if err := fn(st); err != nil {
		return err
	}
	out, err := json.Marshal(st)
	if err != nil {
		return err
	}
	if bytes.Equal(out, raw) {
		return nil
	}
	return s.write(out)
}

// Read returns the state under a shared lock, for CHECK and STATUS.
func (s *Store) Read() (*State, error) {
	unlock, err := s.lock(unix.LOCK_SH)
	if err != nil {
		return nil, err
	}
	defer unlock()
	st, _, err := s.load()
	return st, err
}

func (s *Store) lock(how int) (func(), error) {
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("create IPAM state directory %s: %w", s.Dir, err)
	}
	f, err := os.OpenFile(filepath.Join(s.Dir, lockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open IPAM lock: %w", err)
	}
	for {
		err = unix.Flock(int(f.Fd()), how)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock IPAM state %s: %w", s.Dir, err)
	}
	// Closing the file releases the lock.
	return func() { f.Close() }, nil
}

func (s *Store) path() string { return filepath.Join(s.Dir, statePrefix+s.BootID+stateSuffix) }

// load reads this boot's table. Without one, it starts empty, keeping only
// the round-robin cursors of an earlier boot's table if that is readable:
// the earlier boot's records died with its network namespaces.
func (s *Store) load() (*State, []byte, error) {
	raw, err := os.ReadFile(s.path())
	if errors.Is(err, fs.ErrNotExist) {
		return &State{BootID: s.BootID, Last: s.earlierCursors()}, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read IPAM state: %w", err)
	}
	st := &State{}
	if err := json.Unmarshal(raw, st); err != nil || st.BootID != s.BootID {
		return nil, nil, fmt.Errorf("IPAM state %s is unreadable (%v): move it aside to start with an empty table, then restart the pods of this node", s.path(), err)
	}
	return st, raw, nil
}

// earlierCursors reads the cursors of an earlier boot's table, if any.
func (s *Store) earlierCursors() map[string]netip.Addr {
	old, _ := filepath.Glob(filepath.Join(s.Dir, statePrefix+"*"+stateSuffix))
	for _, path := range old {
		var st State
		if raw, err := os.ReadFile(path); err == nil && json.Unmarshal(raw, &st) == nil {
			return st.Last
		}
	}
	return nil
}

// removeEarlier deletes the tables of earlier boots once this boot has one.
func (s *Store) removeEarlier() {
	old, _ := filepath.Glob(filepath.Join(s.Dir, statePrefix+"*"+stateSuffix))
	for _, path := range old {
		if path != s.path() {
			os.Remove(path)
		}
	}
}

func (s *Store) write(data []byte) error {
	tmp, err := os.CreateTemp(s.Dir, ".allocations-*.tmp")
	if err != nil {
		return fmt.Errorf("write IPAM state: %w", err)
	}
	defer os.Remove(tmp.Name()) // a no-op after the rename
	_, err = tmp.Write(data)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		_, statErr := os.Stat(s.path())
		err = os.Rename(tmp.Name(), s.path())
		if err == nil && statErr != nil {
			s.removeEarlier() // the first table of this boot
		}
	}
	if err != nil {
		return fmt.Errorf("write IPAM state in %s: %w", s.Dir, err)
	}
	return nil
}
