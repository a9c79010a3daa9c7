package ipam

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// File names inside the state directory: the table of a boot lives in two
// slots, allocations.<boot ID>.0 and .1.
const (
	statePrefix = "allocations."
	lockFile    = "lock"
	delLockFile = "del.lock"
	slots       = 2
	// tempPattern names the first table of a boot until it is renamed
	// into its slot (os.CreateTemp's pattern).
	tempPattern = ".allocations-*.tmp"
)

// BootIDPath is where the kernel tells which boot this is.
const BootIDPath = "/proc/sys/kernel/random/boot_id"

// Store is the on-disk State of one node, in a directory of its own. An
// exclusive flock on the directory's lock file serialises the plugin
// processes.
//
// The table is double-buffered: every change overwrites the older of two
// slot files in place with a header that carries a generation number, the
// length and a CRC of the table, and the reader takes the valid slot of the
// highest generation. A plugin killed in the middle of a write leaves that
// slot torn (a bad CRC), and the other slot, the table before the change,
// is read instead. Writing in place, rather than writing a new file and
// renaming it over the old one, creates and frees no inode and no blocks
// (but for the first table of a boot, which is renamed into place): on
// a filesystem mounted with discard, freeing the old file's blocks on every
// pod start and stop waited for the disk, with every other plugin of the
// node queued behind the lock.
//
// The slots are named after the kernel's boot ID, and that is why there is no
// fsync (which costs milliseconds on every pod start): unsynced data is only
// lost by a kernel crash or power loss, that is, with the boot, and every
// record of an earlier boot is void anyway, since its pods' network
// namespaces are gone. Within one boot the page cache makes each write
// visible to every process at once.
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
	t, err := s.load()
	if err != nil {
		return err
	}
	if err := fn(t.state); err != nil {
		return err
	}
	out, err := json.Marshal(t.state)
	if err != nil {
		return err
	}
	if bytes.Equal(out, t.body) {
		return nil
	}
	return s.write(t, out)
}

// Read returns the state under a shared lock, for CHECK and STATUS.
func (s *Store) Read() (*State, error) {
	unlock, err := s.lock(unix.LOCK_SH)
	if err != nil {
		return nil, err
	}
	defer unlock()
	t, err := s.load()
	if err != nil {
		return nil, err
	}
	return t.state, nil
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

// slotPath is the file of slot i of this boot's table.
func (s *Store) slotPath(i int) string {
	return filepath.Join(s.Dir, statePrefix+s.BootID+"."+strconv.Itoa(i))
}

// table is this boot's table as loaded: the state, its encoded body, its
// generation and the slot it came from (-1: none on disk yet).
type table struct {
	state *State
	body  []byte
	gen   uint64
	slot  int
}

// load reads this boot's table from its newest valid slot. Without any
// slot (a new boot), it starts empty, keeping only the round-robin cursors of an earlier
// boot's table if one is readable: the earlier boot's records died with its
// network namespaces.
func (s *Store) load() (*table, error) {
	var best *table
	found := 0
	for i := range slots {
		raw, err := os.ReadFile(s.slotPath(i))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read IPAM state: %w", err)
		}
		found++
		if gen, body, ok := decodeSlot(raw); ok && (best == nil || gen > best.gen) {
			best = &table{body: body, gen: gen, slot: i}
		}
	}
	if found == 0 {
		return &table{state: &State{BootID: s.BootID, Last: s.earlierCursors()}, slot: -1}, nil
	}
	if best == nil {
		return nil, s.unreadable(errors.New("no slot holds a complete table"))
	}
	best.state = &State{}
	if err := json.Unmarshal(best.body, best.state); err != nil || best.state.BootID != s.BootID {
		return nil, s.unreadable(err)
	}
	return best, nil
}

func (s *Store) unreadable(err error) error {
	return fmt.Errorf("IPAM state %s is unreadable (%v): move the files aside to start with an empty table, then restart the pods of this node",
		filepath.Join(s.Dir, statePrefix+s.BootID+".*"), err)
}

// earlierCursors reads the cursors of an earlier boot's table, if any.
func (s *Store) earlierCursors() map[string]netip.Addr {
	old, _ := filepath.Glob(filepath.Join(s.Dir, statePrefix+"*"))
	for _, path := range old {
		raw, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		var st State
		if _, body, ok := decodeSlot(raw); ok && json.Unmarshal(body, &st) == nil {
			return st.Last
		}
	}
	return nil
}

// removeEarlier deletes the tables of earlier boots once this boot has a
// slot.
func (s *Store) removeEarlier() {
	old, _ := filepath.Glob(filepath.Join(s.Dir, statePrefix+"*"))
	for _, path := range old {
		if path != s.slotPath(0) && path != s.slotPath(1) {
			os.Remove(path)
		}
	}
}

// write puts body into the slot t did not come from, one generation up. The
// first table of a boot is written to a temporary file and renamed into
// slot 0, so that a slot on its own is always complete; later ones overwrite
// the older slot in place.
func (s *Store) write(t *table, body []byte) error {
	data := encodeSlot(t.gen+1, body)
	var err error
	if t.slot < 0 {
		err = s.create(s.slotPath(0), data)
		if err == nil {
			s.removeEarlier()
		}
	} else {
		err = overwrite(s.slotPath((t.slot+1)%slots), data)
	}
	if err != nil {
		return fmt.Errorf("write IPAM state in %s: %w", s.Dir, err)
	}
	return nil
}

func overwrite(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	_, err = f.WriteAt(data, 0)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func (s *Store) create(path string, data []byte) error {
	tmp, err := os.CreateTemp(s.Dir, tempPattern)
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // a no-op after the rename
	_, err = tmp.Write(data)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// Files are the paths of the store's files in dir: every boot's slots,
// the lock, a temporary file a crash left. A node's cleanup removes them,
// and only them: the folder may hold files of others.
func Files(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if isStoreFile(e.Name()) {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	return out, nil
}

func isStoreFile(name string) bool {
	temp, _ := filepath.Match(tempPattern, name)
	return name == lockFile || name == delLockFile || strings.HasPrefix(name, statePrefix) || temp
}

// TryLockDel takes the DEL lock of the store in dir unless another process
// holds it: ok says whether this DEL runs alone (the plugin decides by it
// how to delete a veth pair). The lock lives beside the store so that a
// node's cleanup removes its file with the store's.
func TryLockDel(dir string) (unlock func(), ok bool) {
	f, err := os.OpenFile(filepath.Join(dir, delLockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, false
	}
	if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
		f.Close()
		return nil, false
	}
	return func() { f.Close() }, true
}

// slotMagic starts every slot: "netplane-ipam <generation> <length> <crc32>\n",
// then the table as JSON. Bytes after the length are a longer earlier table's
// tail: slots are overwritten, never truncated.
const slotMagic = "netplane-ipam"

func encodeSlot(gen uint64, body []byte) []byte {
	head := fmt.Sprintf("%s %d %d %08x\n", slotMagic, gen, len(body), crc32.ChecksumIEEE(body))
	return append([]byte(head), body...)
}

// decodeSlot returns the generation and table of a slot, and false for a
// slot that a killed writer left torn.
func decodeSlot(raw []byte) (gen uint64, body []byte, ok bool) {
	head, rest, found := bytes.Cut(raw, []byte("\n"))
	f := strings.Fields(string(head))
	if !found || len(f) != 4 || f[0] != slotMagic {
		return 0, nil, false
	}
	gen, err1 := strconv.ParseUint(f[1], 10, 64)
	n, err2 := strconv.Atoi(f[2])
	sum, err3 := strconv.ParseUint(f[3], 16, 32)
	if err1 != nil || err2 != nil || err3 != nil || n < 0 || n > len(rest) || crc32.ChecksumIEEE(rest[:n]) != uint32(sum) {
		return 0, nil, false
	}
	return gen, rest[:n], true
}
