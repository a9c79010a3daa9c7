package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/netplane/netplane/config"
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
		{"cleanup of another role", []string{"--role=dns", "--cleanup"}, "--cleanup removes what the node role made: run it with --role=node"},
		{"keeping IPAM without cleanup", []string{"--role=node", "--cleanup-keep-ipam"}, "--cleanup-keep-ipam applies only with --cleanup"},
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
