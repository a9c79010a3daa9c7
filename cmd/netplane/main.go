// Command netplane is the network control plane of a Kubernetes cluster in
// one binary. --role picks what this process does:
//
//	controller  the EndpointSlice controllers
//	dns         the cluster DNS server
//	node        the node agent: service proxy and pod networking
//
// Several roles may share one process (--role=controller,dns); they then
// share one API client, one informer per resource, one health server and one
// metrics server. internal/process runs them on controller-runtime's manager.
//
// `netplane --role=node --cleanup` removes what the node role made on its
// node and exits, as kube-proxy --cleanup does (package node's Cleanup).
// `netplane explain` says why a connection works or fails (docs/explain.md);
// `netplane version` prints the version.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/config"
	"github.com/netplane/netplane/internal/capability"
	"github.com/netplane/netplane/internal/process"
	"github.com/netplane/netplane/internal/role"
	"github.com/netplane/netplane/internal/version"
	"github.com/netplane/netplane/node"
)

func main() {
	if err := capability.RaisePermitted(); err != nil {
		// The DNS role's bind on port 53 says what it lacks, if it does.
		fmt.Fprintf(os.Stderr, "netplane: making the permitted capabilities effective: %v\n", err)
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1 // a role failed, the leader election Lease was lost, the stop took longer than --shutdown-timeout, or --cleanup left something
	exitUsage   = 2 // bad flags or configuration
)

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "version" {
		fmt.Fprintln(stdout, version.String())
		return exitOK
	}
	if len(args) > 0 && args[0] == "explain" {
		return runExplain(args[1:], stdout, stderr)
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
		fmt.Fprintf(stderr, "Usage: netplane --role=ROLE[,ROLE...] [flags]\n       netplane --role=node --cleanup [--cleanup-keep-ipam] [flags]\n       netplane explain --from=SOURCE --to=DESTINATION [--port=PORT] [-o text|json]\n       netplane version\n\n"+
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
	cleanup, err := config.CleanupOf(fs)
	if err != nil {
		fmt.Fprintf(stderr, "netplane: %v\n", err)
		return exitUsage
	}
	if cleanup.Run {
		return runCleanup(cfg, cleanup.KeepIPAM, stdout, stderr)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	src := role.Source{File: config.File(fs), Load: func() (*v1alpha1.Configuration, error) { return config.Load(fs, table) }}
	if err := process.Run(ctx, cfg, src, roles); err != nil {
		klog.ErrorS(err, "netplane stopped")
		klog.Flush()
		return exitFailure
	}
	klog.Flush()
	return exitOK
}

// runCleanup removes what the node role made on this node and exits:
// exitFailure only when something of it remains.
func runCleanup(cfg *v1alpha1.Configuration, keepIPAM bool, stdout, stderr io.Writer) int {
	if !slices.Contains(cfg.Roles, v1alpha1.RoleNode) {
		fmt.Fprintln(stderr, "netplane: --cleanup removes what the node role made: run it with --role=node and the node's settings")
		return exitUsage
	}
	if err := node.Cleanup(cfg.Node, keepIPAM, stdout); err != nil {
		fmt.Fprintf(stderr, "netplane: cleanup left something of the node role on this node:\n%v\n", err)
		return exitFailure
	}
	return exitOK
}
