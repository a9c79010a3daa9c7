package lab

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A process that a lab's containerd starts and that leaves it, as a shim
// does (its parent exits, it is reparented away from the lab), is killed
// by Down after containerd itself is gone: Down finds it by containerd's
// cgroup, not by a record of its pid.
func TestDownKillsWhatOutlivesContainerd(t *testing.T) {
	if os.Geteuid() != 0 || len(cgroupHierarchies()) == 0 {
		t.Skip("needs root and mounted cgroup hierarchies")
	}
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "logs"), 0o755); err != nil {
		t.Fatal(err)
	}
	l := &Lab{Config: Config{StateDir: dir}, state: newStateFile(dir)}
	cgroup := fmt.Sprintf("/lab-down-test-%d-containerd", os.Getpid())
	shimFile := filepath.Join(dir, "shim.pid")
	// The stand-in containerd starts its "shim" once it is in its cgroup
	// (a line on its stdin says so) and exits without waiting for it.
	cmd := exec.Command("sh", "-c", `read go; sleep 600 & echo $! > "$1"`, "containerd", shimFile)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	p, err := l.startInCgroup(cmd, "containerd", cgroup)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(stdin, "go")
	if err, exited := p.Wait(10 * time.Second); !exited || err != nil {
		t.Fatalf("the stand-in containerd: exited %v, %v", exited, err)
	}
	data, err := os.ReadFile(shimFile)
	if err != nil {
		t.Fatal(err)
	}
	shim, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(shim, syscall.SIGKILL); removeCgroup(cgroup) })
	if err := syscall.Kill(shim, 0); err != nil {
		t.Fatalf("the shim %d is not running before Down: %v", shim, err)
	}

	if err := Down(dir, t.Logf); err != nil {
		t.Fatal(err)
	}
	if !waitGone(shim, 5*time.Second) {
		t.Fatalf("Down left the shim (pid %d) running", shim)
	}
	if _, err := os.Stat(filepath.Join(cgroupHierarchies()[0], cgroup)); !os.IsNotExist(err) {
		t.Errorf("Down left containerd's cgroup: %v", err)
	}
}
