package framework

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

// NetplaneBinaries is the folder holding netplane and netplane-cni. Under
// `make test`, which builds them first and sets $NETPLANE_BIN_DIR, that is
// bin/. Run by hand, they are built from the working tree once per test
// process (go's build cache makes this quick) so a test never runs a stale
// binary; the package's TestMain (Main, RunShared) removes them at the end.
func NetplaneBinaries(t testing.TB) string {
	t.Helper()
	if d := os.Getenv("NETPLANE_BIN_DIR"); d != "" {
		RequireBinary(t, "netplane")
		RequireBinary(t, "netplane-cni")
		return d
	}
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "netplane-bin-")
		if buildErr != nil {
			return
		}
		for _, b := range []struct{ name, pkg, cgo string }{
			{"netplane", "./cmd/netplane", "0"},
			{"netplane-cni", "./cmd/netplane-cni", "0"},
		} {
			cmd := exec.Command("go", "build", "-o", filepath.Join(buildDir, b.name), b.pkg)
			cmd.Dir = RepoRoot()
			cmd.Env = append(os.Environ(), "CGO_ENABLED="+b.cgo)
			if out, err := cmd.CombinedOutput(); err != nil {
				buildErr = fmt.Errorf("go build %s: %v\n%s", b.pkg, err, out)
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildDir
}

// RemoveBinaries deletes what NetplaneBinaries built in this process.
func RemoveBinaries() {
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
}

var servingLine = regexp.MustCompile(`"serving".*server="(health|metrics)" address="([^"]+)"`)

// metricsBound is controller-runtime's line once its metrics server
// listens: netplane logs the address before the manager binds it.
const metricsBound = `"Serving metrics server"`

// ServedAddresses waits until a netplane process has logged the addresses of
// its health and metrics servers (it picks free ports for port 0) and both
// listen, and returns them.
func ServedAddresses(t testing.TB, p *Process, timeout time.Duration) (health, metrics string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		data, _ := os.ReadFile(p.Log)
		for _, m := range servingLine.FindAllStringSubmatch(string(data), -1) {
			if m[1] == "health" {
				health = m[2]
			} else {
				metrics = m[2]
			}
		}
		if health != "" && metrics != "" && strings.Contains(string(data), metricsBound) {
			return health, metrics
		}
		if p.Exited() {
			t.Fatalf("%s exited before serving:\n%s", p.Name, p.Tail(30))
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s did not log its server addresses within %v:\n%s", p.Name, timeout, p.Tail(30))
	return "", ""
}

// HTTPGet fetches url with client and returns the status code and body.
func HTTPGet(client *http.Client, url string) (int, string, error) {
	resp, err := client.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// Eventually polls cond every 50 ms until it returns nil, and returns how
// long that took; when timeout passes first, it fails the test with what
// was awaited and cond's last error. Every package's tests wait with it.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() error) time.Duration {
	t.Helper()
	return EventuallyEvery(t, 50*time.Millisecond, timeout, what, cond)
}

// EventuallyEvery is Eventually polling at interval: a few milliseconds
// where the test reports how long a change took to show.
func EventuallyEvery(t testing.TB, interval, timeout time.Duration, what string, cond func() error) time.Duration {
	t.Helper()
	start := time.Now()
	if err := Poll(context.Background(), interval, timeout, what, func(context.Context) error { return cond() }); err != nil {
		t.Fatal(err)
	}
	return time.Since(start)
}

// Poll calls cond every interval until it returns nil. When timeout passes
// or ctx ends first, it returns what was awaited with cond's last error; an
// error cond marks Final (a process it needed exited) ends the wait at
// once. Eventually and the lab, which has no test to fail, wait with it.
func Poll(ctx context.Context, interval, timeout time.Duration, what string, cond func(context.Context) error) error {
	var last error
	err := wait.PollUntilContextTimeout(ctx, interval, timeout, true, func(ctx context.Context) (bool, error) {
		last = cond(ctx)
		var final finalError
		if errors.As(last, &final) {
			return false, final.error
		}
		return last == nil, nil
	})
	var final finalError
	switch {
	case err == nil:
		return nil
	case errors.As(last, &final):
		return fmt.Errorf("%s: %w", what, final.error)
	case last == nil: // ctx ended before cond ran
		last = err
	}
	return fmt.Errorf("%s: not true after %v: %w", what, timeout, last)
}

// Final marks an error that makes Poll stop waiting.
func Final(err error) error { return finalError{err} }

type finalError struct{ error }
