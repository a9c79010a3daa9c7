package ipam

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

func TestStoreKeepsAttachmentsOfTheSameBootAndDropsThoseOfAnEarlierOne(t *testing.T) {
	dir := t.TempDir()
	r := []netip.Prefix{pfx("10.244.1.0/24")}
	s := &Store{Dir: dir, BootID: "boot-1"}
	if err := s.Update(func(st *State) error {
		_, err := st.Allocate(r, Request{ContainerID: "a", IfName: "eth0"}, "vethA", nil)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	st, err := s.Read()
	if err != nil || len(st.Attachments) != 1 || st.Attachments[0].HostVeth != "vethA" {
		t.Fatalf("same boot: %+v %v", st, err)
	}
	rebooted := &Store{Dir: dir, BootID: "boot-2"}
	st, err = rebooted.Read()
	if err != nil || len(st.Attachments) != 0 {
		t.Fatalf("after reboot: %+v %v, want no attachments", st, err)
	}
	// The cursor survives the reboot: addresses are still handed out in turn.
	var got netip.Prefix
	if err := rebooted.Update(func(st *State) error {
		a, err := st.Allocate(r, Request{ContainerID: "b", IfName: "eth0"}, "", nil)
		got = a.IPs[0]
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if got.String() != "10.244.1.3/24" {
		t.Fatalf("after reboot got %s, want 10.244.1.3/24", got)
	}
	if files, _ := filepath.Glob(filepath.Join(dir, "allocations.*")); len(files) != 1 || files[0] != rebooted.slotPath(0) {
		t.Fatalf("tables on disk after the reboot: %v, want only this boot's", files)
	}
}

func TestATornTableOfAnEarlierBootIsIgnored(t *testing.T) {
	dir := t.TempDir()
	// What a power loss can leave: the earlier boot's table, half written.
	os.WriteFile(filepath.Join(dir, "allocations.boot-1.json"), []byte(`{"bootID":"boot-1","attach`), 0o600)
	s := &Store{Dir: dir, BootID: "boot-2"}
	if err := s.Update(func(st *State) error {
		_, err := st.Allocate([]netip.Prefix{pfx("10.0.0.0/24")}, Request{ContainerID: "a", IfName: "eth0"}, "", nil)
		return err
	}); err != nil {
		t.Fatalf("after a torn table of an earlier boot: %v", err)
	}
	if files, _ := filepath.Glob(filepath.Join(dir, "allocations.*")); len(files) != 1 {
		t.Fatalf("tables on disk: %v", files)
	}
}

func TestAWriteTornByAKilledPluginLeavesTheTableBeforeIt(t *testing.T) {
	r := []netip.Prefix{pfx("10.244.1.0/24")}
	for _, tc := range []struct {
		name string
		tear func(slot []byte) []byte
	}{
		{"cut short", func(b []byte) []byte { return b[:len(b)/2] }},
		{"header only", func(b []byte) []byte { return b[:bytes.IndexByte(b, '\n')+1] }},
		{"body changed", func(b []byte) []byte { b[len(b)-3] ^= 0xff; return b }},
		{"empty", func([]byte) []byte { return nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Store{Dir: t.TempDir(), BootID: "b"}
			for _, cid := range []string{"a", "b", "c"} {
				if err := s.Update(func(st *State) error {
					_, err := st.Allocate(r, Request{ContainerID: cid, IfName: "eth0"}, "", nil)
					return err
				}); err != nil {
					t.Fatal(err)
				}
			}
			// Three writes: slot 0, slot 1, slot 0. Tear the newest.
			raw, err := os.ReadFile(s.slotPath(0))
			if err != nil {
				t.Fatal(err)
			}
			os.WriteFile(s.slotPath(0), tc.tear(raw), 0o600)
			st, err := s.Read()
			if err != nil {
				t.Fatalf("after a torn write: %v", err)
			}
			if len(st.Attachments) != 2 || st.Attachments[1].ContainerID != "b" {
				t.Fatalf("attachments %+v, want a and b (the table before the torn write)", st.Attachments)
			}
			// The next write goes to the torn slot and is read back.
			if err := s.Update(func(st *State) error { st.Release("a", "eth0"); return nil }); err != nil {
				t.Fatal(err)
			}
			if st, _ := s.Read(); len(st.Attachments) != 1 || st.Attachments[0].ContainerID != "b" {
				t.Fatalf("after the next write: %+v", st)
			}
		})
	}
}

func TestASlotOverwrittenWithAShorterTableIgnoresTheOldTail(t *testing.T) {
	s := &Store{Dir: t.TempDir(), BootID: "b"}
	r := []netip.Prefix{pfx("10.244.0.0/22")}
	for i := range 20 {
		if err := s.Update(func(st *State) error {
			_, err := st.Allocate(r, Request{ContainerID: fmt.Sprint(i), IfName: "eth0"}, "", nil)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 20 {
		if err := s.Update(func(st *State) error { st.Release(fmt.Sprint(i), "eth0"); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	st, err := s.Read()
	if err != nil || len(st.Attachments) != 0 {
		t.Fatalf("got %+v, %v; want an empty table", st, err)
	}
}

func TestStoreDoesNotWriteWhenUpdateFails(t *testing.T) {
	dir := t.TempDir()
	s := &Store{Dir: dir, BootID: "b"}
	want := fmt.Errorf("boom")
	if err := s.Update(func(st *State) error {
		st.Attachments = append(st.Attachments, Attachment{ContainerID: "x"})
		return want
	}); err != want {
		t.Fatalf("got %v", err)
	}
	if files, _ := filepath.Glob(filepath.Join(dir, "allocations.*")); len(files) != 0 {
		t.Fatalf("state written after a failed update: %v", files)
	}
}

func TestStoreRefusesACorruptFileAndKeepsIt(t *testing.T) {
	dir := t.TempDir()
	s := &Store{Dir: dir, BootID: "b"}
	path := s.slotPath(0)
	os.WriteFile(path, []byte("{not json"), 0o600)
	err := s.Update(func(*State) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "move the files aside") {
		t.Fatalf("got %v, want an error that says what to do", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "{not json" {
		t.Fatal("corrupt file was overwritten")
	}
}

// helperEnv makes the test binary act as one plugin process allocating
// addresses (see TestMain).
const helperEnv = "NETPLANE_IPAM_HELPER"

func TestMain(m *testing.M) {
	if spec := os.Getenv(helperEnv); spec != "" {
		os.Exit(helper(spec))
	}
	os.Exit(m.Run())
}

// helper allocates n addresses as container "<id>-<i>" in dir, one Update
// (lock, read, write) each, as n plugin invocations would.
func helper(spec string) int {
	parts := strings.Split(spec, ",")
	dir, id := parts[0], parts[1]
	n, _ := strconv.Atoi(parts[2])
	s := &Store{Dir: dir, BootID: "b"}
	for i := range n {
		if err := s.Update(func(st *State) error {
			_, err := st.Allocate([]netip.Prefix{pfx("10.244.0.0/22"), pfx("fd00::/64")},
				Request{ContainerID: fmt.Sprintf("%s-%d", id, i), IfName: "eth0"}, "", nil)
			return err
		}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	return 0
}

func TestParallelProcessesNeverGetTheSameAddress(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	dir := t.TempDir()
	const procs, each = 8, 25
	var wg sync.WaitGroup
	errs := make(chan error, procs)
	for p := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s,p%d,%d", helperEnv, dir, p, each))
			if out, err := cmd.CombinedOutput(); err != nil {
				errs <- fmt.Errorf("process %d: %v: %s", p, err, out)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	st, err := (&Store{Dir: dir, BootID: "b"}).Read()
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Attachments) != procs*each {
		t.Fatalf("%d attachments, want %d", len(st.Attachments), procs*each)
	}
	if used := st.used(); len(used) != 2*procs*each {
		t.Fatalf("%d distinct addresses for %d attachments of 2 families", len(used), procs*each)
	}
}

func TestFilesAreTheStoresOnly(t *testing.T) {
	for _, tc := range []struct {
		name string
		ours bool
	}{
		{"lock", true},
		{"del.lock", true},
		{"allocations.0b3c.0", true},
		{"allocations.0b3c.1", true},
		{"allocations.earlier-boot.0", true},
		{".allocations-123456.tmp", true},
		{"lockfile", false},
		{"notes.txt", false},
		{".allocations-123456", false},
	} {
		if got := isStoreFile(tc.name); got != tc.ours {
			t.Errorf("isStoreFile(%q) = %v, want %v", tc.name, got, tc.ours)
		}
	}
	if files, err := Files(filepath.Join(t.TempDir(), "none")); err != nil || files != nil {
		t.Errorf("Files of a missing folder: %q, %v; want none, no error", files, err)
	}
}
