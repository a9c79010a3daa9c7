package config

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/netplane/netplane/apis/config/v1alpha1"
)

// load parses args against a fresh flag set, with a config file holding file
// (none when empty) and the given environment.
func load(t *testing.T, file string, env map[string]string, args ...string) (*v1alpha1.Configuration, error) {
	t.Helper()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	table := AddFlags(fs)
	if file != "" {
		path := filepath.Join(t.TempDir(), "netplane.yaml")
		if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--config="+path)
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return Load(fs, table)
}

func TestPrecedenceFlagOverEnvOverFileOverDefault(t *testing.T) {
	file := "apiVersion: netplane.io/v1alpha1\nkind: Configuration\ndns:\n  ttl: 10\n"
	cases := []struct {
		name string
		file string
		env  map[string]string
		args []string
		want int32
	}{
		{"default", "", nil, nil, 5},
		{"file over default", file, nil, nil, 10},
		{"env over file", file, map[string]string{"NETPLANE_TTL": "20"}, nil, 20},
		{"flag over env", file, map[string]string{"NETPLANE_TTL": "20"}, []string{"--ttl=30"}, 30},
		{"flag over file", file, nil, []string{"--ttl=30"}, 30},
		{"explicit zero in file is kept", "dns:\n  ttl: 0\n", nil, nil, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := load(t, c.file, c.env, append([]string{"--role=dns"}, c.args...)...)
			if err != nil {
				t.Fatal(err)
			}
			if got := cfg.DNS.TTL; got != c.want {
				t.Errorf("dns.ttl = %d, want %d", got, c.want)
			}
		})
	}
}

func TestEveryLayerReachesEveryKind(t *testing.T) {
	file := `
roles: [controller]
controller:
  endpointUpdatesBatchPeriod: 2s
  leaderElection:
    leaderElect: false
dns:
  upstreamServers: ["127.0.0.1:5353"]
node:
  clusterCIDRs: [10.244.0.0/16, fd00:10:244::/56]
`
	c, err := load(t, file, map[string]string{
		"NETPLANE_KUBE_API_QPS":       "50",
		"NETPLANE_NODEPORT_ADDRESSES": "10.0.0.0/8,primary",
	}, "--shutdown-timeout=3s", "--autopath=false", "--service-cidrs=10.96.0.0/12,fd00:10:96::/112", "--wireguard-permissive")
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"roles from file", strings.Join(c.Roles, ","), "controller"},
		{"duration from file", c.Controller.EndpointUpdatesBatchPeriod.Duration, 2 * time.Second},
		{"nested bool from file", c.Controller.LeaderElection.LeaderElect, false},
		{"list from file", strings.Join(c.DNS.UpstreamServers, ","), "127.0.0.1:5353"},
		{"dual-stack list from file", len(c.Node.ClusterCIDRs), 2},
		{"float from env", c.ClientConnection.QPS, float32(50)},
		{"list from env", strings.Join(c.Node.NodePortAddresses, ","), "10.0.0.0/8,primary"},
		{"duration from flag", c.ShutdownTimeout.Duration, 3 * time.Second},
		{"bool from flag", c.DNS.Autopath, false},
		{"list from flag", fmt.Sprint(c.Node.ServiceCIDRs), "[10.96.0.0/12 fd00:10:96::/112]"},
		{"untouched default", c.Controller.MaxEndpointsPerSlice, int32(100)},
		{"encryption default", c.Node.Encryption.Mode, "none"},
		{"wireguard port default", c.Node.Encryption.WireGuardPort, int32(51820)},
		{"permissive from flag", c.Node.Encryption.Permissive, true},
		{"wireguard defaults", c.Node.Encryption.Implementation + " " + c.Node.Encryption.PrivateKeyFile, "auto /var/lib/netplane/wireguard/private.key"},
	}
	for _, ch := range checks {
		if ch.got != ch.want {
			t.Errorf("%s: got %v, want %v", ch.name, ch.got, ch.want)
		}
	}
}

func TestFileErrorsNameTheField(t *testing.T) {
	cases := []struct {
		name, file, want string
	}{
		{"unknown top-level field", "dsn:\n  ttl: 5\n", "dsn: unknown field"},
		{"unknown nested field", "dns:\n  tll: 5\n", "dns.tll: unknown field"},
		{"unknown field two levels down", "controller:\n  leaderElection:\n    elect: true\n", "controller.leaderElection.elect: unknown field"},
		{"every unknown field", "dns:\n  tll: 5\nnode:\n  bogus: 1\n", "dns.tll: unknown field\nnode.bogus: unknown field"},
		{"wrong type", "dns:\n  ttl: five\n", "dns.ttl: expected int32, got string"},
		{"wrong type list", "dns:\n  upstreamServers: 5\n", "dns.upstreamServers: expected []string, got number"},
		{"wrong type of stub domain servers", "dns:\n  stubDomains:\n    corp.example: 5\n", "dns.stubDomains: expected []string, got number"},
		{"bad CIDR", "node:\n  clusterCIDRs: [10.244.0.0/16, 10.245.0.0]\n", `node.clusterCIDRs[1]: netip.ParsePrefix("10.245.0.0"): no '/'`},
		{"bad duration", "dns:\n  upstreamTimeout: soon\n", `dns.upstreamTimeout: "soon" is not a duration`},
		{"not yaml", "dns: [\n", "not valid YAML"},
		{"wrong kind", "kind: KubeProxyConfiguration\n", "kind: must be Configuration"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := load(t, c.file, nil, "--role=dns")
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error = %v, want it to contain %q", err, c.want)
			}
			if c.name != "not yaml" && !strings.Contains(err.Error(), "netplane.yaml") && !strings.HasPrefix(c.want, "kind") {
				t.Errorf("error %q does not name the file", err)
			}
		})
	}
}

func TestValidationErrorsNameTheField(t *testing.T) {
	cases := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"ttl too large", []string{"--ttl=4000"}, nil, "dns.ttl: must be between 0 and 3600"},
		{"ttl from env", nil, map[string]string{"NETPLANE_TTL": "-1"}, "dns.ttl: must be between 0 and 3600"},
		{"slice size", []string{"--max-endpoints-per-slice=0"}, nil, "controller.maxEndpointsPerSlice: must be between 1 and 1000"},
		{"pod records", []string{"--pod-records=all"}, nil, "dns.podRecords: must be one of disabled, insecure, verified"},
		{"cluster cidr", []string{"--cluster-cidr=10.244.0.0/16,10.244.0.0"}, nil, `node.clusterCIDRs[1]: netip.ParsePrefix("10.244.0.0"): no '/'`},
		{"cluster cidr from env", nil, map[string]string{"NETPLANE_CLUSTER_CIDR": "10.244.0.0/33"}, `node.clusterCIDRs[0]: netip.ParsePrefix("10.244.0.0/33"): prefix length out of range`},
		{"service cidr", []string{"--service-cidrs=10.96.0.0"}, nil, `node.serviceCIDRs[0]: netip.ParsePrefix("10.96.0.0"): no '/'`},
		{"every invalid value", []string{"--ttl=4000", "--max-endpoints-per-slice=0"}, nil, "controller.maxEndpointsPerSlice: must be between 1 and 1000, got 0\ndns.ttl: must be between 0 and 3600, got 4000"},
		{"two service cidrs of one family", []string{"--service-cidrs=10.96.0.0/16,fd00:10:96::/112,10.97.0.0/16"}, nil, `node.serviceCIDRs[2]: at most one CIDR per IP family: "10.96.0.0/16" and "10.97.0.0/16" are both IPv4`},
		{"upstream", []string{"--upstream-servers=dns.example"}, nil, "dns.upstreamServers[0]: must be an IP address"},
		{"serve stale", []string{"--dns-serve-stale=-1s"}, nil, "dns.serveStale: must be between 0s and 168h0m0s"},
		{"kube-dns configmap", []string{"--kube-dns-configmap=kube-dns"}, nil, `dns.kubeDNSConfigMap: must be namespace/name like kube-system/kube-dns, or "" to read none, got "kube-dns"`},
		{"bind address", []string{"--health-bind-address=nowhere"}, nil, "healthBindAddress: must be host:port"},
		{"pprof address", []string{"--pprof-bind-address=nowhere"}, nil, "pprofBindAddress: must be host:port"},
		{"unknown role", []string{"--role=proxy"}, nil, `roles: unknown role "proxy": valid roles are controller,dns,node`},
		{"no role", []string{"--role="}, nil, "roles: no role given"},
		{"bridge name", []string{"--bridge=a-very-long-bridge-name"}, nil, "node.bridge: must be an interface name"},
		{"encryption mode", []string{"--encryption=ipsec"}, nil, "node.encryption.mode: must be one of none, wireguard"},
		{"wireguard port", []string{"--wireguard-port=0"}, nil, "node.encryption.wireguardPort: must be between 1 and 65535"},
		{"wireguard implementation", nil, map[string]string{"NETPLANE_WIREGUARD_IMPLEMENTATION": "boringtun"}, "node.encryption.implementation: must be one of auto, kernel, userspace"},
		{"wireguard key file", []string{"--wireguard-private-key-file=private.key"}, nil, "node.encryption.privateKeyFile: must be an absolute path"},
		{"lameduck outlasting the stop", []string{"--lameduck=10s", "--shutdown-timeout=5s"}, nil, "dns.lameduck: must be at least 0 and less than shutdownTimeout (5s)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			args := c.args
			if !strings.HasPrefix(strings.Join(args, " "), "--role") {
				args = append([]string{"--role=dns"}, args...)
			}
			_, err := load(t, "", c.env, args...)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error = %v, want it to contain %q", err, c.want)
			}
		})
	}
}

// A value that does not decode does not hide the other errors, and is
// reported once (not again by validation, which sees it unset).
func TestEveryErrorIsReportedOnce(t *testing.T) {
	cases := []struct {
		name, file string
		args       []string
		want       []string
	}{
		{"flags", "", []string{"--cluster-cidr=10.244.0.0/16,bad", "--ttl=4000", "--mtu=100"},
			[]string{`node.clusterCIDRs[1]: netip.ParsePrefix("bad"): no '/'`, "dns.ttl: must be between 0 and 3600, got 4000", "node.mtu: must be 0 (auto) or at least 576, got 100"}},
		{"file", "dns:\n  ttl: five\n  upstreamTimeout: soon\nnode:\n  clusterCIDRs: [bad]\n", nil,
			[]string{"dns.ttl: cannot parse value as 'int32'", `dns.upstreamTimeout: "soon" is not a duration like 30s`, `node.clusterCIDRs[0]: netip.ParsePrefix("bad"): no '/'`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := load(t, c.file, nil, append([]string{"--role=node"}, c.args...)...)
			if err == nil {
				t.Fatalf("no error, want %q", c.want)
			}
			lines := strings.Split(err.Error(), "\n")
			if len(lines) != len(c.want) {
				t.Errorf("%d errors, want %d:\n%s", len(lines), len(c.want), err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// CIDRs are parsed once, at load, and handed on as prefixes: blanks in a
// list are dropped and a prefix is its network, as kube-proxy reads it.
func TestCIDRsAreParsedAtLoad(t *testing.T) {
	c, err := load(t, "node:\n  serviceCIDRs: [10.96.0.0/16]\n", map[string]string{"NETPLANE_CLUSTER_CIDR": "10.244.1.0/16, fd00:10:244::/56"}, "--role=node")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprint(c.Node.ClusterCIDRs), "[10.244.0.0/16 fd00:10:244::/56]"; got != want {
		t.Errorf("clusterCIDRs = %s, want %s", got, want)
	}
	if got, want := fmt.Sprint(c.Node.ServiceCIDRs), "[10.96.0.0/16]"; got != want {
		t.Errorf("serviceCIDRs = %s, want %s", got, want)
	}
}

func TestDisablingAServerWithAnEmptyAddress(t *testing.T) {
	c, err := load(t, "", nil, "--role=dns", "--metrics-bind-address=", "--health-bind-address=127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if c.MetricsBindAddress != "" || c.HealthBindAddress != "127.0.0.1:0" {
		t.Errorf("metrics=%q health=%q", c.MetricsBindAddress, c.HealthBindAddress)
	}
}

// Stub domains come from the file only (a map has no flag), keep the dots
// of their names, and are checked against the cluster domain whichever
// layer set it.
func TestStubDomainsFromTheFile(t *testing.T) {
	file := "dns:\n  stubDomains:\n    corp.example: [10.0.0.53, \"10.0.0.54:5353\"]\n    Lab.Corp.Example.: [\"[fd00::53]:53\", fd00::54]\n"
	c, err := load(t, file, nil, "--role=dns")
	if err != nil {
		t.Fatal(err)
	}
	got := fmt.Sprint(c.DNS.StubDomains)
	if want := "map[corp.example:[10.0.0.53 10.0.0.54:5353] lab.corp.example.:[[fd00::53]:53 fd00::54]]"; got != want {
		t.Errorf("stubDomains = %s, want %s", got, want)
	}
	cases := []struct {
		name, file string
		args       []string
		want       string
	}{
		{"the cluster domain itself", "dns:\n  stubDomains:\n    cluster.local: [10.0.0.53]\n", nil,
			"dns.stubDomains[cluster.local]: is inside the cluster domain cluster.local, which netplane answers itself"},
		{"inside the cluster domain", "dns:\n  stubDomains:\n    svc.cluster.local.: [10.0.0.53]\n", nil,
			"dns.stubDomains[svc.cluster.local.]: is inside the cluster domain cluster.local"},
		{"inside a cluster domain set by flag", "dns:\n  stubDomains:\n    corp.example: [10.0.0.53]\n", []string{"--cluster-domain=k8s.corp.example"},
			""},
		{"the cluster domain set by flag", "dns:\n  stubDomains:\n    k8s.corp.example: [10.0.0.53]\n", []string{"--cluster-domain=corp.example"},
			"dns.stubDomains[k8s.corp.example]: is inside the cluster domain corp.example"},
		{"a server by name", "dns:\n  stubDomains:\n    corp.example: [ns1.corp.example]\n", nil,
			`dns.stubDomains[corp.example][0]: must be an IP address or IP:port, got "ns1.corp.example"`},
		{"no server", "dns:\n  stubDomains:\n    corp.example: []\n", nil,
			"dns.stubDomains[corp.example]: must list at least one server"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := load(t, c.file, nil, append([]string{"--role=dns"}, c.args...)...)
			if c.want == "" {
				if err != nil {
					t.Fatalf("error %v, want none", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error = %v, want it to contain %q", err, c.want)
			}
		})
	}
}
