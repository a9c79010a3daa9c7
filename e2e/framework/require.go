// Package framework starts the real parts netplane's integration and
// end-to-end tests run against: etcd and kube-apiserver on loopback ports in
// a temporary directory, torn down when the test ends.
package framework

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// RequiredEnv, set to "1" by `make test`, turns every missing tool or missing
// root privilege into a failure instead of a skip.
const RequiredEnv = "NETPLANE_E2E_REQUIRED"

// Require skips the test (or fails it under `make test`) unless ok.
func Require(t testing.TB, ok bool, what string) {
	t.Helper()
	if ok {
		return
	}
	if os.Getenv(RequiredEnv) == "1" {
		t.Fatalf("%s (run `make tools` as root)", what)
	}
	t.Skipf("skipped: %s; `make test` installs what is needed and runs this test", what)
}

// RequireRoot needs uid 0 (network namespaces, nftables).
func RequireRoot(t testing.TB) {
	t.Helper()
	Require(t, os.Geteuid() == 0, "needs root")
}

// RepoRoot is the repository's top folder, found from this source file.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// BinDir holds the binaries `make tools`, `make anchors` and `make build`
// produce; $NETPLANE_BIN_DIR overrides it.
func BinDir() string {
	if d := os.Getenv("NETPLANE_BIN_DIR"); d != "" {
		return d
	}
	return filepath.Join(RepoRoot(), "bin")
}

// Binary finds a tool in BinDir, then on $PATH and in /usr/sbin; "" if absent.
func Binary(name string) string {
	p := filepath.Join(BinDir(), name)
	if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
		return p
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	for _, dir := range []string{"/usr/sbin", "/sbin", "/usr/bin"} {
		if p := filepath.Join(dir, name); fileExists(p) {
			return p
		}
	}
	return ""
}

// RequireBinary returns the path of a tool or skips/fails the test.
func RequireBinary(t testing.TB, name string) string {
	t.Helper()
	p := Binary(name)
	Require(t, p != "", name+" not found in "+BinDir()+" or on $PATH")
	return p
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
