package ipam

import (
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
	if files, _ := filepath.Glob(filepath.Join(dir, "allocations.*")); len(files) != 1 || files[0] != rebooted.path() {
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
	if _, err := os.Stat(s.path()); !os.IsNotExist(err) {
		t.Fatalf("state written after a failed update: %v", err)
	}
}

func TestStoreRefusesACorruptFileAndKeepsIt(t *testing.T) {
	dir := t.TempDir()
	s := &Store{Dir: dir, BootID: "b"}
	path := s.path()
	os.WriteFile(path, []byte("{not json"), 0o600)
	err := s.Update(func(*State) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "move it aside") {
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
	if left, _ := filepath.Glob(filepath.Join(dir, ".allocations-*")); len(left) != 0 {
		t.Fatalf("temporary files left: %v", left)
	}
}
