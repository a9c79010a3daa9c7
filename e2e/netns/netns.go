// Package netns gives tests throwaway network namespaces: hosts, links,
// bridges, processes, listeners and the echo servers every network test
// talks to (echo.go) inside them, all removed when the test ends, also when
// it fails. Nothing here touches the machine's own (root)
// network namespace: every command names its namespace explicitly.
package netns

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/netplane/netplane/e2e/framework"
)

// Prefix starts every namespace name this package makes, followed by the
// test process's pid (see framework.RemoveStaleNamespaces).
const Prefix = framework.NamespacePrefix

var counter atomic.Int64

// NS is one network namespace made by a test.
type NS struct {
	Name string // as in `ip netns list`
	Path string // /run/netns/NAME, for nsenter and setns

	mu    sync.Mutex
	procs []*framework.Process
}

// New makes a namespace with loopback up. label is for people reading
// `ip netns list`; the name is unique.
func New(t testing.TB, label string) *NS {
	t.Helper()
	framework.RequireRoot(t)
	framework.RequireBinary(t, "ip")
	framework.RequireBinary(t, "nsenter")
	ns, err := Create(label)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ns.Delete(); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return ns
}

// Create makes a namespace without a test; the caller must Delete it.
func Create(label string) (*NS, error) {
	name := fmt.Sprintf("%s%d-%s-%d", Prefix, os.Getpid(), label, counter.Add(1))
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("ip netns add %s: %v: %s", name, err, out)
	}
	ns := &NS{Name: name, Path: filepath.Join("/run/netns", name)}
	if _, err := ns.Exec("ip", "link", "set", "lo", "up"); err != nil {
		ns.Delete()
		return nil, err
	}
	return ns, nil
}

// Delete stops the processes started in the namespace and removes it. The
// kernel then removes every interface, route and nftables table in it.
func (ns *NS) Delete() error {
	ns.mu.Lock()
	procs := ns.procs
	ns.procs = nil
	ns.mu.Unlock()
	for _, p := range procs {
		p.Stop(5 * time.Second)
	}
	out, err := exec.Command("ip", "netns", "delete", ns.Name).CombinedOutput()
	if err != nil && !strings.Contains(string(out), "No such file") {
		return fmt.Errorf("ip netns delete %s: %v: %s", ns.Name, err, out)
	}
	return nil
}

// Command returns a command that runs inside the namespace. It uses nsenter,
// not `ip netns exec`, which remounts /sys and hides the cgroup mounts that
// container runtimes need.
func (ns *NS) Command(name string, args ...string) *exec.Cmd {
	return exec.Command("nsenter", append([]string{"--net=" + ns.Path, "--", name}, args...)...)
}

// Exec runs a command inside the namespace and returns its combined output.
func (ns *NS) Exec(name string, args ...string) (string, error) {
	out, err := ns.Command(name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("in %s: %s %s: %v: %s", ns.Name, name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return string(out), nil
}

// MustExec is Exec that fails the test on error.
func (ns *NS) MustExec(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := ns.Exec(name, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Start runs a long-lived command inside the namespace; it is stopped with
// SIGTERM (then SIGKILL) when the namespace is deleted, or earlier by Stop.
func (ns *NS) Start(t testing.TB, name string, args ...string) *framework.Process {
	t.Helper()
	p, err := ns.StartCmd(ns.Command(name, args...), filepath.Join(t.TempDir(), filepath.Base(name)+".log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s in %s, log tail:\n%s", name, ns.Name, p.Tail(40))
		}
	})
	return p
}

// StartCmd starts a prepared command (from Command) with its output in logPath.
func (ns *NS) StartCmd(cmd *exec.Cmd, logPath string) (*framework.Process, error) {
	p, err := framework.StartProcess(filepath.Base(cmd.Args[len(cmd.Args)-1]), cmd, logPath)
	if err != nil {
		return nil, err
	}
	ns.mu.Lock()
	ns.procs = append(ns.procs, p)
	ns.mu.Unlock()
	return p, nil
}

// Do runs fn on an OS thread switched into the namespace. Sockets made in fn
// stay in the namespace after Do returns, which is how a test listens or
// dials inside it.
func (ns *NS) Do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		target, err := os.Open(ns.Path)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), syscall.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("setns %s: %w", ns.Name, err)
			return
		}
		ferr := fn()
		if err := unix.Setns(int(orig.Fd()), syscall.CLONE_NEWNET); err != nil {
			// Leave the thread locked: Go then ends it instead of reusing a
			// thread that sits in the wrong namespace.
			errc <- fmt.Errorf("return from %s: %w", ns.Name, err)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// Sysctl sets a sysctl inside the namespace (net.* keys are per namespace).
func (ns *NS) Sysctl(t testing.TB, key, value string) {
	t.Helper()
	ns.MustExec(t, "sysctl", "-qw", key+"="+value)
}
