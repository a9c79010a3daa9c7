package kube

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/netplane/netplane/apis/config/v1alpha1"
)

func writeKubeconfig(t *testing.T, server string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	os.WriteFile(path, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "`+server+`"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600)
	return path
}

func TestClientConfigSources(t *testing.T) {
	flagFile := writeKubeconfig(t, "https://flag.example:6443")
	envFile := writeKubeconfig(t, "https://env.example:6443")
	cases := []struct {
		name     string
		cc       v1alpha1.ClientConnection
		env      string
		inPod    bool
		wantHost string
		wantErr  string
	}{
		{"the flag wins over $KUBECONFIG", v1alpha1.ClientConnection{Kubeconfig: flagFile}, envFile, false, "https://flag.example:6443", ""},
		{"$KUBECONFIG without the flag", v1alpha1.ClientConnection{}, envFile, false, "https://env.example:6443", ""},
		{"an explicit endpoint overrides the kubeconfig's server", v1alpha1.ClientConnection{Kubeconfig: flagFile, ControlPlaneEndpoint: "https://10.0.0.1:6443"}, "", false, "https://10.0.0.1:6443", ""},
		{"neither, outside a pod", v1alpha1.ClientConnection{}, "", false, "", "no kubeconfig given"},
		{"a missing kubeconfig file", v1alpha1.ClientConnection{Kubeconfig: "/nonexistent/kubeconfig"}, "", false, "", "/nonexistent/kubeconfig"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("KUBECONFIG", c.env)
			// Outside a pod: no in-cluster service host.
			t.Setenv("KUBERNETES_SERVICE_HOST", "")
			c.cc.QPS, c.cc.Burst = 7, 11
			cfg, err := RestConfig(c.cc)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Host != c.wantHost || cfg.QPS != 7 || cfg.Burst != 11 || !strings.HasPrefix(cfg.UserAgent, "netplane/") {
				t.Errorf("host %q qps %v burst %d agent %q; want host %q, qps 7, burst 11", cfg.Host, cfg.QPS, cfg.Burst, cfg.UserAgent, c.wantHost)
			}
		})
	}
}
