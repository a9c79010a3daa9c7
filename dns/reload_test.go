package dns

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/config"
	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/internal/informer"
	"github.com/netplane/netplane/internal/role"
)

// configVolume is a folder laid out as the kubelet lays out a mounted
// ConfigMap: each version in a folder of its own, ..data a symlink to the
// current one, and the file a symlink through ..data. A new version is
// put in place by swapping ..data atomically, never by writing the file.
type configVolume struct {
	dir      string
	versions int
}

func (v *configVolume) write(t *testing.T, content string) {
	t.Helper()
	v.versions++
	version := fmt.Sprintf("..2026_01_01_00_00_%02d.%d", v.versions, v.versions)
	if err := os.Mkdir(filepath.Join(v.dir, version), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(v.dir, version, "config.yaml"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(v.dir, "..data_tmp")
	if err := os.Symlink(version, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(v.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if v.versions == 1 {
		if err := os.Symlink("..data/config.yaml", filepath.Join(v.dir, "config.yaml")); err != nil {
			t.Fatal(err)
		}
	}
}

func TestAChangedConfigFileReroutesWithoutARestart(t *testing.T) {
	up, corp, corp2 := answering(t, "192.0.2.1"), answering(t, "10.0.0.1"), answering(t, "10.0.0.2")
	pc, l := listenBoth(t) // a port free for both, handed to the role
	bind := pc.LocalAddr().String()
	pc.Close()
	l.Close()
	resolv := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(resolv, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	file := func(stubDomain, server string) string {
		return fmt.Sprintf(`apiVersion: netplane.io/v1alpha1
kind: Configuration
roles: [dns]
dns:
  bindAddress: %q
  upstreamServers: [%q]
  resolvConf: %q
  kubeDNSConfigMap: ""
  lameduck: 0s
  stubDomains:
    %s: [%q]
`, bind, up.Addr, resolv, stubDomain, server)
	}
	vol := &configVolume{dir: t.TempDir()}
	vol.write(t, file("corp.example", corp.Addr))

	fs := pflag.NewFlagSet("netplane", pflag.ContinueOnError)
	table := config.AddFlags(fs)
	if err := fs.Parse([]string{"--config=" + filepath.Join(vol.dir, "config.yaml")}); err != nil {
		t.Fatal(err)
	}
	src := role.Source{File: config.File(fs), Load: func() (*v1alpha1.Configuration, error) { return config.Load(fs, table) }}
	cfg, err := src.Load()
	if err != nil {
		t.Fatal(err)
	}
	dead, err := kubernetes.NewForConfig(&restConfigForNowhere)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	parts := Role(role.Deps{Config: cfg, Client: dead, Factory: informer.New(dead), Checks: role.NewChecks(), Metrics: reg, Log: testr.New(t), Source: src})
	go func() { done <- parts[0].Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})

	answeredBy := func(want string) func() error {
		return func() error {
			c := &dns.Client{Timeout: time.Second}
			m, _, err := c.Exchange(query("www.corp.example.", dns.TypeA), bind)
			if err != nil {
				return err
			}
			ip, err := answerIP(m)
			if err == nil && ip != want {
				err = fmt.Errorf("answered %s", ip)
			}
			return err
		}
	}
	framework.EventuallyEvery(t, 10*time.Millisecond, 10*time.Second, "the role to answer from the stub domain's server", answeredBy("10.0.0.1"))

	vol.write(t, file("corp.example", corp2.Addr))
	took := framework.EventuallyEvery(t, 10*time.Millisecond, 2*time.Second, "the changed stub domain to apply", answeredBy("10.0.0.2"))
	t.Logf("file swapped → new stub domain server answering: %v", took)

	// A file that does not load changes nothing, and is counted.
	vol.write(t, file("svc.cluster.local", corp.Addr))
	rejected := func() error {
		if n := gatheredValue(t, reg, "netplane_dns_config_rejected_total", "source", "file"); n != 1 {
			return fmt.Errorf("%v rejections counted, want 1", n)
		}
		return nil
	}
	framework.EventuallyEvery(t, 10*time.Millisecond, 2*time.Second, "the invalid file to be rejected", rejected)
	if err := answeredBy("10.0.0.2")(); err != nil {
		t.Errorf("after an invalid file: %v, want the last valid stub domain", err)
	}
}

// gatheredValue is the value of the counter name whose label is value, 0
// when there is none.
func gatheredValue(t testing.TB, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
