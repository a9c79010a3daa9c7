package framework

import (
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// NamespacePrefix starts the name of every network namespace the tests make
// (e2e/netns); the test process's pid follows it, so the leftovers of a
// killed run can be told apart and removed.
const NamespacePrefix = "np"

// Main is a package's TestMain: it removes the namespaces a killed run of
// tests left behind, runs the tests, removes the binaries they built and
// exits.
func Main(m *testing.M) { os.Exit(run(m)) }

// run is Main's body without the exit, with what a TestMain stops after
// the tests (a shared API server) before the binaries are removed.
func run(m *testing.M, after ...func()) int {
	if os.Geteuid() == 0 {
		RemoveStaleNamespaces()
	}
	code := m.Run()
	for _, f := range after {
		f()
	}
	RemoveBinaries()
	return code
}

var staleNamespace = regexp.MustCompile("^" + NamespacePrefix + `(\d+)-`)

// RemoveStaleNamespaces deletes the namespaces of test processes that were
// killed before their cleanup ran (their pid no longer exists). Namespaces
// of live processes, and any not named by e2e/netns, are left alone.
func RemoveStaleNamespaces() {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		m := staleNamespace.FindStringSubmatch(name)
		if m == nil {
			continue
		}
		pid, _ := strconv.Atoi(m[1])
		if pid == os.Getpid() || syscall.Kill(pid, 0) == nil {
			continue
		}
		_ = exec.Command("ip", "netns", "delete", name).Run()
	}
}
