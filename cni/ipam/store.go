package ipam

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// File names inside the state directory.
const (
	stateFile = "allocations.json"
	lockFile  = "lock"
)

// BootIDPath is where the kernel tells which boot this is.
const BootIDPath = "/proc/sys/kernel/random/boot_id"

// Store is the on-disk State of one node, in a directory of its own. Every
// change is one atomic replace of allocations.json (write a temporary file,
// fsync, rename, fsync the directory), so a plugin killed at any point leaves
// either the old or the new table, never a torn one. An exclusive flock on
// the directory's lock file serialises the plugin processes.
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
	out, err := json.MarshalIndent(st, "", "  ")
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

// load reads the state; a missing file is an empty state. Records of an
// earlier boot are dropped: their namespaces and veths died with that boot.
func (s *Store) load() (*State, []byte, error) {
	path := filepath.Join(s.Dir, stateFile)
	raw, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return &State{BootID: s.BootID}, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read IPAM state: %w", err)
	}
	st := &State{}
	if err := json.Unmarshal(raw, st); err != nil {
		return nil, nil, fmt.Errorf("IPAM state %s is unreadable (%v): move it aside to start with an empty table, then restart the pods of this node", path, err)
	}
	if st.BootID != s.BootID {
		st.BootID = s.BootID
		st.Attachments = nil
	}
	return st, raw, nil
}

func (s *Store) write(data []byte) error {
	tmp, err := os.CreateTemp(s.Dir, ".allocations-*.tmp")
	if err != nil {
		return fmt.Errorf("write IPAM state: %w", err)
	}
	defer os.Remove(tmp.Name()) // a no-op after the rename
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), filepath.Join(s.Dir, stateFile))
	}
	if err == nil {
		err = syncDir(s.Dir)
	}
	if err != nil {
		return fmt.Errorf("write IPAM state in %s: %w", s.Dir, err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
