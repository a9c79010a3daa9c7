// Command netplane is the network control plane of a Kubernetes cluster in
// one binary. --role picks what this process does:
//
//	controller  the EndpointSlice controllers
//	dns         the cluster DNS server
//	node        the node agent: service proxy and pod networking
//
// Several roles may share one process (--role=controller,dns); they then
// share one API client, one informer per resource, one health server and one
// metrics server.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/pflag"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/config"
	"github.com/netplane/netplane/internal/kube"
	"github.com/netplane/netplane/internal/role"
	"github.com/netplane/netplane/internal/serve"
	"github.com/netplane/netplane/internal/version"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1 // a role failed, or the stop took longer than --shutdown-timeout
	exitUsage   = 2 // bad flags or configuration
)

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "version" {
		fmt.Fprintln(stdout, version.String())
		return exitOK
	}
	fs := pflag.NewFlagSet("netplane", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.SortFlags = false
	table := config.AddFlags(fs)
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	for _, name := range []string{"v", "vmodule"} {
		fs.AddGoFlag(klogFlags.Lookup(name))
	}
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: netplane --role=ROLE[,ROLE...] [flags]\n       netplane version\n\n"+
			"Every flag can also be set by the environment variable NETPLANE_<FLAG> (dashes as\n"+
			"underscores) or by the --config file; flags win over the environment, which wins over the file.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return exitOK
		}
		// With ContinueOnError pflag prints nothing itself.
		fmt.Fprintf(stderr, "netplane: %v (netplane --help lists the flags)\n", err)
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "netplane: unexpected argument %q (did you mean --role=%s?)\n", fs.Arg(0), fs.Arg(0))
		return exitUsage
	}
	cfg, err := config.Load(fs, table)
	if err != nil {
		fmt.Fprintf(stderr, "netplane: %s\n", strings.ReplaceAll(err.Error(), "\n", "; "))
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := runRoles(ctx, cfg); err != nil {
		klog.ErrorS(err, "netplane stopped")
		klog.Flush()
		return exitFailure
	}
	klog.Flush()
	return exitOK
}

// roleFuncs maps each role to the function that runs it.
var roleFuncs = map[string]role.Func{
	v1alpha1.RoleController: runController,
	v1alpha1.RoleDNS:        runDNS,
	v1alpha1.RoleNode:       runNode,
}

// runRoles runs the configured roles until ctx ends or one of them fails,
// then stops all of them within cfg.ShutdownTimeout.
func runRoles(ctx context.Context, cfg *v1alpha1.Configuration) error {
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
	registry := prometheus.NewRegistry()
	registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	checks := serve.NewChecks()
	checks.AddHealth("ping", func() error { return nil })
	servers, err := serve.Start(log, cfg.HealthBindAddress, cfg.MetricsBindAddress, checks, registry)
	if err != nil {
		return err
	}

	deps := role.Deps{
		Config:     cfg,
		RestConfig: restConfig,
		Client:     client,
		Informers:  informers.NewSharedInformerFactory(client, 0),
		Checks:     checks,
		Metrics:    registry,
		Log:        log,
	}
	// The initialisation of every package linked in (all roles' and their
	// libraries') left about 20 MiB of the executable resident, more than
	// a role's own heap at 1,000 Services: drop it before the roles start,
	// so a role's peak is not start-up's pages plus its heap. Pages still
	// needed come back from the page cache on first touch.
	role.DropExecutablePages()
	roleCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, len(cfg.Roles))
	for _, name := range cfg.Roles {
		d := deps
		d.Log = klog.Background().WithName(name)
		go func() {
			err := roleFuncs[name](roleCtx, d)
			if err != nil {
				err = fmt.Errorf("role %s: %w", name, err)
			}
			done <- err
		}()
	}

	// Wait for a signal or the first role to return.
	var firstErr error
	remaining := len(cfg.Roles)
	select {
	case <-ctx.Done():
		log.Info("stopping: signal received")
	case firstErr = <-done:
		remaining--
		if firstErr == nil {
			firstErr = errors.New("a role stopped on its own")
		}
	}
	cancel()
	deadline := time.NewTimer(cfg.ShutdownTimeout.Duration)
	defer deadline.Stop()
	for ; remaining > 0; remaining-- {
		select {
		case err := <-done:
			if err != nil && firstErr == nil {
				firstErr = err
			}
		case <-deadline.C:
			return fmt.Errorf("roles did not stop within --shutdown-timeout=%v", cfg.ShutdownTimeout.Duration)
		}
	}
	deps.Informers.Shutdown()
	shutdownCtx, cancelShutdown := context.WithTimeout(context.Background(), time.Second)
	defer cancelShutdown()
	servers.Shutdown(shutdownCtx)
	log.Info("stopped")
	return firstErr
}
