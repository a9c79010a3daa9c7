// Package serve runs the two HTTP servers every netplane process has: one
// for /healthz and /readyz, one for Prometheus /metrics. Several roles in one
// process share them; each role adds its own named checks.
package serve

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Checks is a set of named health and readiness checks. A check returns nil
// when all is well and an error that says what is wrong otherwise.
type Checks struct {
	mu     sync.Mutex
	health map[string]func() error
	ready  map[string]func() error
}

// NewChecks returns an empty set; with no checks both endpoints report ok.
func NewChecks() *Checks {
	return &Checks{health: map[string]func() error{}, ready: map[string]func() error{}}
}

// AddHealth adds a liveness check to /healthz.
func (c *Checks) AddHealth(name string, check func() error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.health[name] = check
}

// AddReady adds a readiness check to /readyz (for example "caches synced").
func (c *Checks) AddReady(name string, check func() error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ready[name] = check
}

// Ready reports whether every readiness check passes.
func (c *Checks) Ready() error { return run(c.snapshot(c.ready)) }

func (c *Checks) snapshot(m map[string]func() error) map[string]func() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]func() error, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func run(checks map[string]func() error) error {
	names := make([]string, 0, len(checks))
	for n := range checks {
		names = append(names, n)
	}
	sort.Strings(names)
	var errs []error
	for _, n := range names {
		if err := checks[n](); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", n, err))
		}
	}
	return errors.Join(errs...)
}

// handler answers 200 "ok" or 503 with one line per failing check, in the
// manner of the Kubernetes components' health endpoints.
func (c *Checks) handler(m map[string]func() error) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		if err := run(c.snapshot(m)); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			for _, line := range strings.Split(err.Error(), "\n") {
				fmt.Fprintf(w, "[-] %s\n", line)
			}
			return
		}
		fmt.Fprintln(w, "ok")
	}
}

// Servers are the running health and metrics servers.
type Servers struct {
	HealthAddr  string // the bound address, "" when disabled
	MetricsAddr string
	servers     []*http.Server
	wg          sync.WaitGroup
}

// Start listens on the given addresses ("" disables one; port 0 picks a free
// port, which is logged). It returns once both are listening.
func Start(log logr.Logger, healthAddr, metricsAddr string, checks *Checks, gatherer prometheus.Gatherer) (*Servers, error) {
	s := &Servers{}
	health := http.NewServeMux()
	health.Handle("/healthz", checks.handler(checks.health))
	health.Handle("/readyz", checks.handler(checks.ready))
	metrics := http.NewServeMux()
	metrics.Handle("/metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{ErrorLog: nil}))

	var err error
	if s.HealthAddr, err = s.listen(log, "health", healthAddr, health); err != nil {
		return nil, err
	}
	if s.MetricsAddr, err = s.listen(log, "metrics", metricsAddr, metrics); err != nil {
		s.Shutdown(context.Background())
		return nil, err
	}
	return s, nil
}

func (s *Servers) listen(log logr.Logger, name, addr string, h http.Handler) (string, error) {
	if addr == "" {
		log.Info("server disabled", "server", name)
		return "", nil
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("%s server: %w", name, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	s.servers = append(s.servers, srv)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error(err, "server stopped", "server", name)
		}
	}()
	log.Info("serving", "server", name, "address", l.Addr().String())
	return l.Addr().String(), nil
}

// Shutdown stops both servers, waiting for requests in flight until ctx ends.
func (s *Servers) Shutdown(ctx context.Context) {
	for _, srv := range s.servers {
		_ = srv.Shutdown(ctx)
	}
	s.wg.Wait()
}
