package main

import (
	"strings"
	"testing"
)

func TestExplainFlags(t *testing.T) {
	t.Setenv("KUBECONFIG", "")
	cases := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no --to", []string{"explain", "--from=x/a"}, exitUsage, "--from and --to are required"},
		{"bad output", []string{"explain", "--from=x/a", "--to=x/b", "-o", "yaml"}, exitUsage, "-o yaml: text or json"},
		{"extra argument", []string{"explain", "--from=x/a", "--to=x/b", "now"}, exitUsage, `unexpected argument "now"`},
		{"protocol in upper case", []string{"explain", "--from=x/a", "--to=x/b", "--port=80/TCP"}, exitFailure, "the protocol is tcp, udp or sctp, in lower case"},
		{"no API server", []string{"explain", "--from=x/a", "--to=x/b", "--config=/nonexistent.yaml"}, exitFailure, "config file"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(c.args...)
			if code != c.code || !strings.Contains(stderr, c.want) || stdout != "" {
				t.Errorf("exit %d (want %d), stderr %q (want %q), stdout %q", code, c.code, stderr, c.want, stdout)
			}
			if c.code == exitFailure && strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
				t.Errorf("more than one line: %q", stderr)
			}
		})
	}
}
