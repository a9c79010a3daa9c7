package process

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/internal/role"
)

// testConfig is a valid configuration whose kubeconfig points nowhere: the
// client is built but never used by the fake roles below.
func testConfig(t *testing.T, roles ...string) *v1alpha1.Configuration {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: "https://127.0.0.1:1"}
	kc.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: "x"}
	kc.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	kc.CurrentContext = "c"
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		t.Fatal(err)
	}
	cfg := v1alpha1.Default()
	cfg.Roles = roles
	cfg.ClientConnection.Kubeconfig = kubeconfig
	cfg.HealthBindAddress, cfg.MetricsBindAddress = "127.0.0.1:0", "127.0.0.1:0"
	cfg.ShutdownTimeout.Duration = 500 * time.Millisecond
	return cfg
}

func wholeRoles(funcs map[string]role.Func) map[string]role.Role {
	out := map[string]role.Role{}
	for name, f := range funcs {
		out[name] = role.Whole(name, f)
	}
	return out
}

func TestGracefulShutdown(t *testing.T) {
	polite := func(ctx context.Context, _ role.Deps) error { <-ctx.Done(); return nil }
	stubborn := func(ctx context.Context, _ role.Deps) error { time.Sleep(time.Minute); return nil }
	failing := func(ctx context.Context, _ role.Deps) error { return errors.New("boom") }
	quitting := func(ctx context.Context, _ role.Deps) error { return nil }
	cases := []struct {
		name    string
		funcs   map[string]role.Func
		roles   []string
		signal  bool
		wantErr string
		within  time.Duration
	}{
		{"every role stops on the signal", map[string]role.Func{"dns": polite, "node": polite}, []string{"dns", "node"}, true, "", 300 * time.Millisecond},
		{"a role that ignores the signal is abandoned after the timeout", map[string]role.Func{"dns": polite, "node": stubborn}, []string{"dns", "node"}, true, "did not stop within --shutdown-timeout=500ms", 2 * time.Second},
		{"a failing role stops the others", map[string]role.Func{"dns": polite, "controller": failing}, []string{"dns", "controller"}, false, "role controller: boom", 300 * time.Millisecond},
		{"a role that returns on its own stops the others", map[string]role.Func{"dns": quitting, "node": polite}, []string{"dns", "node"}, false, "role dns stopped on its own", 300 * time.Millisecond},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			errc := make(chan error, 1)
			go func() { errc <- Run(ctx, testConfig(t, c.roles...), role.Source{}, wholeRoles(c.funcs)) }()
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
				t.Fatal("Run did not return")
			}
		})
	}
}

var servingLine = regexp.MustCompile(`"msg"="serving" "server"="(\w+)" "address"="([^"]+)"`)

// startManager runs a manager for cfg with parts until the test ends and
// returns the addresses it logged, by server.
func startManager(t *testing.T, cfg *v1alpha1.Configuration, checks *role.Checks, parts ...role.Runnable) map[string]string {
	t.Helper()
	var mu sync.Mutex
	addrs := map[string]string{}
	log := funcr.New(func(_, args string) {
		if m := servingLine.FindStringSubmatch(args); m != nil {
			mu.Lock()
			addrs[m[1]] = m[2]
			mu.Unlock()
		}
	}, funcr.Options{})
	mgr, err := NewManager(cfg, &rest.Config{Host: "https://127.0.0.1:1"}, checks, log)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range parts {
		if err := mgr.Add(p); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager stopped with %v", err)
		}
	})
	mu.Lock()
	defer mu.Unlock()
	return addrs
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	var code int
	var body []byte
	var last error
	// Until the manager has started its servers, the address refuses.
	err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		resp, err := http.Get(url)
		if last = err; err != nil {
			return false, nil
		}
		defer resp.Body.Close()
		code = resp.StatusCode
		body, err = io.ReadAll(resp.Body)
		return true, err
	})
	if err != nil {
		t.Fatal(err, last)
	}
	return code, string(body)
}

// /readyz is 503 naming every role not ready, as kube-proxy's and CoreDNS's
// endpoints answer, and /readyz/NAME says why; liveness does not follow
// readiness; /metrics serves controller-runtime's registry with the Go and
// process metrics.
func TestReadyzNamesTheRoleNotReadyAndHealthzIsSeparate(t *testing.T) {
	var synced atomic.Bool
	checks := role.NewChecks()
	checks.Starting("dns") // as Run does for every role
	begin := make(chan struct{})
	part := role.Runnable{Role: "dns", Run: func(ctx context.Context) error {
		<-begin
		checks.AddReady("dns", func() error {
			if !synced.Load() {
				return errors.New("informer caches have not synced yet")
			}
			return nil
		})
		checks.AddReady("proxy", func() error { return nil })
		checks.AddHealth("proxy", func() error { return nil })
		<-ctx.Done()
		return nil
	}}
	addrs := startManager(t, testConfig(t, "dns"), checks, part)
	health, metrics := addrs["health"], addrs["metrics"]
	if health == "" || metrics == "" || strings.HasSuffix(health, ":0") || strings.HasSuffix(metrics, ":0") {
		t.Fatalf("logged addresses %v, want the ports port 0 picked", addrs)
	}
	if code, body := get(t, "http://"+health+"/readyz/dns"); code != http.StatusServiceUnavailable || !strings.Contains(body, "starting") {
		t.Errorf("/readyz/dns = %d %q before the role added its checks, want 503 starting", code, body)
	}
	close(begin)
	_ = wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		return len(checks.Readiness()) >= 2, nil
	}) // /readyz is checked below
	if code, body := get(t, "http://"+health+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "[-]dns failed") || strings.Contains(body, "[-]proxy") {
		t.Errorf("/readyz = %d %q, want 503 naming dns only", code, body)
	}
	if code, body := get(t, "http://"+health+"/readyz/dns"); code != http.StatusServiceUnavailable || !strings.Contains(body, "informer caches have not synced yet") {
		t.Errorf("/readyz/dns = %d %q, want 503 with the reason", code, body)
	}
	if code, body := get(t, "http://"+health+"/healthz"); code != http.StatusOK || strings.TrimSpace(body) != "ok" {
		t.Errorf("/healthz = %d %q while not ready; liveness must not follow readiness", code, body)
	}
	synced.Store(true)
	if code, body := get(t, "http://"+health+"/readyz"); code != http.StatusOK {
		t.Errorf("/readyz = %d %q once every check passes", code, body)
	}
	if code, body := get(t, "http://"+metrics+"/metrics"); code != http.StatusOK || !strings.Contains(body, "go_goroutines") || !strings.Contains(body, "process_resident_memory_bytes") {
		t.Errorf("/metrics = %d, body starts %.300q", code, body)
	}
}

func TestAnEmptyAddressDisablesThatServer(t *testing.T) {
	cfg := testConfig(t, "dns")
	cfg.HealthBindAddress = ""
	addrs := startManager(t, cfg, role.NewChecks())
	if _, ok := addrs["health"]; ok || addrs["metrics"] == "" {
		t.Errorf("servers %v, want metrics only", addrs)
	}
}

func TestAHealthAddressInUseIsAnError(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	cfg := testConfig(t, "dns")
	cfg.HealthBindAddress = l.Addr().String()
	_, err = NewManager(cfg, &rest.Config{Host: "https://127.0.0.1:1"}, role.NewChecks(), logr.Discard())
	if err == nil || !strings.Contains(err.Error(), "health server") {
		t.Errorf("health server on %s, in use: %v", l.Addr(), err)
	}
}
