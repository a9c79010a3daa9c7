package serve

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func TestReadyzNamesEveryFailingCheckAndHealthzIsSeparate(t *testing.T) {
	checks := NewChecks()
	var dnsErr error = errors.New("informer caches have not synced yet")
	checks.AddReady("dns", func() error { return dnsErr })
	checks.AddReady("proxy", func() error { return nil })
	checks.AddHealth("ping", func() error { return nil })
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "netplane_test_total", Help: "t"}))
	s, err := Start(logr.Discard(), "127.0.0.1:0", "127.0.0.1:0", checks, reg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(t.Context())

	code, body := get(t, "http://"+s.HealthAddr+"/readyz")
	if code != http.StatusServiceUnavailable || strings.TrimSpace(body) != "[-] dns: informer caches have not synced yet" {
		t.Errorf("/readyz = %d %q", code, body)
	}
	if code, body := get(t, "http://"+s.HealthAddr+"/healthz"); code != http.StatusOK || strings.TrimSpace(body) != "ok" {
		t.Errorf("/healthz = %d %q while not ready; liveness must not follow readiness", code, body)
	}
	dnsErr = nil
	if code, _ := get(t, "http://"+s.HealthAddr+"/readyz"); code != http.StatusOK {
		t.Errorf("/readyz = %d once every check passes", code)
	}
	if code, body := get(t, "http://"+s.MetricsAddr+"/metrics"); code != http.StatusOK || !strings.Contains(body, "netplane_test_total 0") {
		t.Errorf("/metrics = %d %q", code, body)
	}
}

func TestAnEmptyAddressDisablesThatServer(t *testing.T) {
	s, err := Start(logr.Discard(), "", "127.0.0.1:0", NewChecks(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(t.Context())
	if s.HealthAddr != "" || s.MetricsAddr == "" {
		t.Errorf("health %q metrics %q", s.HealthAddr, s.MetricsAddr)
	}
}

func TestAnAddressInUseIsAnError(t *testing.T) {
	s, err := Start(logr.Discard(), "127.0.0.1:0", "", NewChecks(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(t.Context())
	if _, err := Start(logr.Discard(), s.HealthAddr, "", NewChecks(), prometheus.NewRegistry()); err == nil || !strings.Contains(err.Error(), "health server") {
		t.Errorf("second server on %s: %v", s.HealthAddr, err)
	}
}
