package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/config"
	"github.com/netplane/netplane/internal/role"
)

func runCLI(args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestRoleDispatchErrors(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"missing role", nil, "no role given: set --role to one or more of controller,dns,node"},
		{"unknown role", []string{"--role=proxy"}, `unknown role "proxy": valid roles are controller,dns,node`},
		{"unknown in a list", []string{"--role=dns,cni"}, `unknown role "cni": valid roles are controller,dns,node`},
		{"repeated role", []string{"--role=dns,dns"}, `role "dns" given twice`},
		{"positional role", []string{"dns"}, `unexpected argument "dns"`},
		{"mistyped flag", []string{"--rol=node"}, "unknown flag: --rol"},
		{"unknown flag after a valid one", []string{"--role=node", "--bogus"}, "unknown flag: --bogus"},
		{"bad flag value", []string{"--role=dns", "--ttl=five"}, `invalid argument "five" for "--ttl" flag`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, _, stderr := runCLI(c.args...)
			if code != exitUsage {
				t.Errorf("exit code %d, want %d", code, exitUsage)
			}
			if strings.Count(strings.TrimSpace(stderr), "\n") != 0 || !strings.Contains(stderr, c.want) {
				t.Errorf("stderr %q, want one line containing %q", stderr, c.want)
			}
		})
	}
}

func TestVersionPrintsVersionCommitAndGo(t *testing.T) {
	code, stdout, _ := runCLI("version")
	if code != exitOK || !strings.Contains(stdout, "netplane v") || !strings.Contains(stdout, "commit ") || !strings.Contains(stdout, "go1.") {
		t.Fatalf("version: code %d, output %q", code, stdout)
	}
}

func TestHelpDocumentsEveryFlag(t *testing.T) {
	code, _, stderr := runCLI("--help")
	if code != exitOK {
		t.Fatalf("--help exit code %d", code)
	}
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	config.AddFlags(fs)
	fs.VisitAll(func(f *pflag.Flag) {
		if !strings.Contains(stderr, "--"+f.Name+" ") || f.Usage == "" {
			t.Errorf("--help does not document --%s", f.Name)
		}
	})
	for _, f := range []string{"--v ", "--vmodule "} {
		if !strings.Contains(stderr, f) {
			t.Errorf("--help lacks the log flag %s", f)
		}
	}
}

func TestBadConfigFileExitsWithTheFieldNamed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(path, []byte("dns:\n  ttl: 99999\n"), 0o600)
	code, _, stderr := runCLI("--role=dns", "--config="+path)
	if code != exitUsage || !strings.Contains(stderr, "dns.ttl: must be between 0 and 3600") {
		t.Fatalf("code %d stderr %q", code, stderr)
	}
}

// testConfig is a valid configuration whose kubeconfig points nowhere: the
// client is built but never used by the fake roles below.
func testConfig(t *testing.T, roles ...string) *v1alpha1.Configuration {
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600)
	cfg := v1alpha1.Default()
	cfg.Roles = roles
	cfg.ClientConnection.Kubeconfig = kubeconfig
	cfg.HealthBindAddress, cfg.MetricsBindAddress = "127.0.0.1:0", "127.0.0.1:0"
	cfg.ShutdownTimeout.Duration = 500 * time.Millisecond
	return cfg
}

// withRoles swaps the role table for the test.
func withRoles(t *testing.T, funcs map[string]role.Func) {
	saved := roleFuncs
	roleFuncs = funcs
	t.Cleanup(func() { roleFuncs = saved })
}

func TestGracefulShutdown(t *testing.T) {
	polite := func(ctx context.Context, _ role.Deps) error { <-ctx.Done(); return nil }
	stubborn := func(ctx context.Context, _ role.Deps) error { time.Sleep(time.Minute); return nil }
	failing := func(ctx context.Context, _ role.Deps) error { return errors.New("boom") }
	cases := []struct {
		name    string
		funcs   map[string]role.Func
		roles   []string
		signal  bool
		wantErr string
		within  time.Duration
	}{
		{"every role stops on the signal", map[string]role.Func{"dns": polite, "node": polite}, []string{"dns", "node"}, true, "", 300 * time.Millisecond},
		{"a role that ignores the signal is abandoned after the timeout", map[string]role.Func{"dns": polite, "node": stubborn}, []string{"dns", "node"}, true, "did not stop within --shutdown-timeout", 2 * time.Second},
		{"a failing role stops the others", map[string]role.Func{"dns": polite, "controller": failing}, []string{"dns", "controller"}, false, "role controller: boom", 300 * time.Millisecond},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			withRoles(t, c.funcs)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			errc := make(chan error, 1)
			go func() { errc <- runRoles(ctx, testConfig(t, c.roles...)) }()
			time.Sleep(100 * time.Millisecond)
			start := time.Now()
			if c.signal {
				cancel()
			}
			select {
			case err := <-errc:
				if took := time.Since(start); took > c.within {
					t.Errorf("stopped after %v, want within %v", took, c.within)
				}
				if (err == nil) != (c.wantErr == "") || (err != nil && !strings.Contains(err.Error(), c.wantErr)) {
					t.Errorf("error %v, want %q", err, c.wantErr)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("runRoles did not return")
			}
		})
	}
}
