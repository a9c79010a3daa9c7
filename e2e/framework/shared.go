package framework

import (
	"fmt"
	"os"
	"sync"
	"testing"
)

// One API server per test binary: started by the first test that asks, with
// that test's options, and stopped by CloseShared in TestMain. Tests share it
// and keep apart by namespace or object names.
var (
	sharedOnce sync.Once
	shared     *APIServer
	sharedErr  error
)

// SharedAPIServer returns the test binary's API server, starting it on first
// use. It skips with -short, and skips or fails (per Require) without the
// binaries.
func SharedAPIServer(t testing.TB, opts Options) *APIServer {
	t.Helper()
	if testing.Short() {
		t.Skip("needs kube-apiserver; skipped with -short")
	}
	RequireBinary(t, "etcd")
	RequireBinary(t, "kube-apiserver")
	sharedOnce.Do(func() { shared, sharedErr = StartAPIServerMain(opts) })
	if sharedErr != nil {
		t.Fatalf("starting kube-apiserver: %v", sharedErr)
	}
	return shared
}

// RunShared is Main that also stops the shared API server if one was
// started.
func RunShared(m *testing.M) {
	os.Exit(run(m, func() {
		if shared != nil {
			shared.Close()
		}
	}))
}

// RunWithAPIServer is a TestMain body for a package whose tests share one
// API server they may also stop and start (*api): it exits 0 without the
// binaries (1 under `make test`), starts it, runs the tests, and removes
// it and the binaries they built.
func RunWithAPIServer(m *testing.M, opts Options, api **APIServer) {
	if Binary("etcd") == "" || Binary("kube-apiserver") == "" {
		if os.Getenv(RequiredEnv) == "1" {
			fmt.Fprintln(os.Stderr, "etcd or kube-apiserver missing: run `make tools`")
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, "skipping: etcd or kube-apiserver missing (make tools)")
		os.Exit(0)
	}
	s, err := StartAPIServerMain(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	*api = s
	os.Exit(run(m, s.Close))
}

// TempDir is a folder for a test that runs a container runtime: removed at
// the end after everything mounted below it is unmounted, and a mount that
// would not go fails the test.
func TempDir(t testing.TB, prefix string) string {
	t.Helper()
	// Under /tmp, short: a unix socket path inside must fit in 108 bytes.
	dir, err := os.MkdirTemp("/tmp", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if left := UnmountUnder(dir); len(left) > 0 {
			t.Errorf("mounts left: %v", left)
		}
		os.RemoveAll(dir)
	})
	return dir
}
