// Package process runs netplane's roles in one process on controller-runtime's
// manager. The manager owns what every Kubernetes component has around its
// work: Prometheus /metrics from controller-runtime's registry, the order in
// which parts start and stop, and a graceful stop
// bounded by --shutdown-timeout; /healthz and /readyz are served by a
// server the manager runs (health.go says why it is not the manager's own).
// Leader election is netplane's own (election.go says why).
//
// The roles use neither the manager's cache nor its client. They read the
// process's one informer per resource (internal/informer), each through
// views of its own, and run their own loops, tuned against the upstream
// systems they replace: the controller's write budget reserves a token
// before a worker dequeues and finds pods through a label index; the DNS
// role's pods view feeds a table of addresses, with no informer cache, to
// stay under half of CoreDNS's memory; the proxy keeps records, not
// objects. controller-runtime's cache keeps whole objects per kind and its
// client reads through that cache, which would undo all three.
package process

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/internal/informer"
	"github.com/netplane/netplane/internal/kube"
	"github.com/netplane/netplane/internal/listen"
	"github.com/netplane/netplane/internal/memory"
	"github.com/netplane/netplane/internal/outage"
	"github.com/netplane/netplane/internal/role"
	"github.com/netplane/netplane/internal/version"
)

// A role's parts are what the manager runs.
var _ manager.LeaderElectionRunnable = role.Runnable{}

// Run runs the configured roles, built by roles, until ctx ends (nil after
// a graceful stop) or one fails, or the stop outlasts
// --shutdown-timeout (an error). cfg came from src.
func Run(ctx context.Context, cfg *v1alpha1.Configuration, src role.Source, roles map[string]role.Role) error {
	log := klog.Background().WithName("netplane")
	log.Info("starting", "version", version.Version, "commit", version.Commit, "roles", cfg.Roles)
	restConfig, err := kube.RestConfig(cfg.ClientConnection)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	checks := role.NewChecks()
	mgr, err := NewManager(cfg, restConfig, checks, log)
	if err != nil {
		return err
	}
	deps := role.Deps{
		Config:     cfg,
		RestConfig: restConfig,
		Client:     client,
		Checks:     checks,
		Metrics:    metrics.Registry,
		Source:     src,
	}
	if cfg.MetricsBindAddress != "" {
		deps.MetricsHandler = mgr.AddMetricsServerExtraHandler
	}
	deps.Factory, err = informers(ctx, restConfig, log)
	if err != nil {
		return err
	}
	var parts []role.Runnable
	for _, name := range cfg.Roles {
		d := deps
		d.Role, d.Log = name, klog.Background().WithName(name)
		checks.Starting(name)
		parts = append(parts, roles[name](d)...)
	}
	if err := AddParts(mgr, cfg, restConfig, parts, log); err != nil {
		return err
	}
	// The initialisation of every package linked in (all roles' and their
	// libraries') left about 20 MiB of the executable resident, more than
	// a role's own heap at 1,000 Services: drop it before the roles start,
	// so a role's peak is not start-up's pages plus its heap. Pages still
	// needed come back from the page cache on first touch.
	memory.DropExecutablePages()
	err = mgr.Start(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("roles did not stop within --shutdown-timeout=%v: %w", cfg.ShutdownTimeout.Duration, err)
	}
	if err != nil {
		return err
	}
	log.Info("stopped")
	return nil
}

// informers is the process's informer factory: protobuf, and through an
// outage gate probing the API server's /readyz, its metrics registered.
func informers(ctx context.Context, restConfig *rest.Config, log logr.Logger) (*informer.Factory, error) {
	cfg := role.ProtobufConfig(restConfig)
	probe, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	gate := outage.New(outage.DefaultPolicy, outage.Readyz(probe.Discovery().RESTClient()), log.WithName("apiserver"))
	if err := gate.Register(metrics.Registry); err != nil && !errors.As(err, &prometheus.AlreadyRegisteredError{}) {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(gate.Config(ctx, cfg))
	if err != nil {
		return nil, err
	}
	return informer.NewWithGate(client, gate), nil
}

// AddParts adds the roles' parts to mgr; those that need the Lease run
// under one campaign of their own (election.go) when leader election is on.
func AddParts(mgr manager.Manager, cfg *v1alpha1.Configuration, restConfig *rest.Config, parts []role.Runnable, log logr.Logger) error {
	var leading []role.Runnable
	for _, part := range parts {
		if part.Elected && electing(cfg) {
			leading = append(leading, part)
			continue
		}
		if err := mgr.Add(part); err != nil {
			return err
		}
	}
	if len(leading) == 0 {
		return nil
	}
	e, err := newElected(cfg.Controller.LeaderElection, restConfig, leading, log.WithName("leader-election"))
	if err != nil {
		return err
	}
	return mgr.Add(e)
}

// electing reports whether the elected parts run only while this process
// holds the Lease (election.go); otherwise they run as the others do.
func electing(cfg *v1alpha1.Configuration) bool {
	return cfg.Controller.LeaderElection.LeaderElect && slices.Contains(cfg.Roles, v1alpha1.RoleController)
}

// NewManager returns the manager the roles run on, set from cfg: metrics on
// metricsBindAddress, /healthz and /readyz from checks on
// healthBindAddress, and a stop bounded by shutdownTimeout. A bind address of
// port 0 is given a free port here, which is logged; "" turns that server
// off. It never calls the API server.
func NewManager(cfg *v1alpha1.Configuration, restConfig *rest.Config, checks *role.Checks, log logr.Logger) (manager.Manager, error) {
	setupOnce.Do(func() {
		// controller-runtime's own packages (healthz, leader election
		// events) log through its global logger.
		ctrllog.SetLogger(klog.Background())
		// kube-proxy and CoreDNS export the Go and process metrics; the
		// manager's registry has only client-go's.
		for _, c := range []prometheus.Collector{collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})} {
			if err := metrics.Registry.Register(c); err != nil && !errors.As(err, &prometheus.AlreadyRegisteredError{}) {
				log.Error(err, "runtime metrics")
			}
		}
	})
	// The health server binds first, so the free port found for the
	// metrics server is never the one the health server then takes.
	// A node agent's successor, started beside it by a DaemonSet's surge,
	// binds the same host ports before the running agent lets go
	// (internal/handover): the node role's servers share their ports.
	lc := net.ListenConfig{}
	if slices.Contains(cfg.Roles, v1alpha1.RoleNode) {
		lc = listen.Config
	}
	var health net.Listener
	if cfg.HealthBindAddress != "" {
		l, err := lc.Listen(context.Background(), "tcp", cfg.HealthBindAddress)
		if err != nil {
			return nil, fmt.Errorf("health server: %w", err)
		}
		health = l
	}
	metricsAddr := "0" // the manager's word for "off"
	if cfg.MetricsBindAddress != "" {
		addr, err := freePort(cfg.MetricsBindAddress)
		if err != nil {
			closeListener(health)
			return nil, fmt.Errorf("metrics server: %w", err)
		}
		metricsAddr = addr
	}
	opts := manager.Options{
		Logger:                  log,
		Metrics:                 metricsserver.Options{BindAddress: metricsAddr, ListenConfig: lc},
		PprofBindAddress:        cfg.PprofBindAddress,
		GracefulShutdownTimeout: &cfg.ShutdownTimeout.Duration,
	}
	mgr, err := manager.New(rest.CopyConfig(restConfig), opts)
	if err != nil {
		closeListener(health)
		return nil, err
	}
	if health != nil {
		srv := &http.Server{Handler: healthHandler(checks), ReadHeaderTimeout: 5 * time.Second}
		if err := mgr.Add(&manager.Server{Name: "health", Server: srv, Listener: health}); err != nil {
			health.Close()
			return nil, err
		}
		log.Info("serving", "server", "health", "address", health.Addr().String())
	} else {
		log.Info("server disabled", "server", "health")
	}
	if metricsAddr == "0" {
		log.Info("server disabled", "server", "metrics")
	} else {
		// The manager binds it as it starts, before any role.
		log.Info("serving", "server", "metrics", "address", metricsAddr)
	}
	return mgr, nil
}

var setupOnce sync.Once

func closeListener(l net.Listener) {
	if l != nil {
		l.Close()
	}
}

// freePort returns addr with port 0 replaced by a port free now. The
// manager binds the metrics address itself and logs only what it was
// given, so port 0 would leave the port unknown. Another process may take
// the port before the manager binds it; then the start fails (exit 1),
// loudly. Port 0 is for tests and labs, where nothing else races for it.
func freePort(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || port != "0" {
		return addr, err
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return "", err
	}
	defer l.Close()
	_, port, _ = net.SplitHostPort(l.Addr().String())
	return net.JoinHostPort(host, port), nil
}
