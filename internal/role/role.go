// Package role is the contract between the netplane process and its roles
// (controller, dns, node, relay): what each role is handed, and how it runs. The
// process (internal/process) runs the parts of every role as Runnables on
// controller-runtime's manager; this package does not import the manager,
// so a role's own tests run without it.
package role

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sync/atomic"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/internal/informer"
)

// Deps is what the process hands every role. Roles in one process share the
// client, the informer factory (so each resource is watched once), the checks
// and the metrics registry (controller-runtime's, which the process serves;
// a test passes its own).
type Deps struct {
	// Role is the role's name. Until it adds a readiness check of that
	// name or calls WaitForSync, /readyz names it as starting.
	Role       string
	Config     *v1alpha1.Configuration
	RestConfig *rest.Config
	Client     kubernetes.Interface
	// Factory is the process's one informer per resource: roles register
	// their views of a resource when they are built (role.Role), before
	// any part runs, and WaitForSync starts it.
	Factory *informer.Factory
	Checks  *Checks
	Metrics prometheus.Registerer
	// MetricsHandler serves a handler beside /metrics on the metrics
	// address; call it while the role is built. Nil when metrics are off.
	MetricsHandler func(path string, h http.Handler) error
	Log            logr.Logger
	// Source is where Config came from, for a role that applies changes
	// to the file while it runs.
	Source Source
	// Takeover is set by a node agent that starts while another runs on
	// its node: each of its features waits in it once its views have
	// synced, before its first write, until the running agent let go of
	// the node (internal/handover); one that stops before leaves it. Nil:
	// write at once.
	Takeover Takeover
	// Keeper keeps what a node feature's process runs of the data path
	// (wireguard-go) running after the feature stopped, until the next
	// agent claims it (Takeover.Claim) or this one exits. Nil: a feature
	// stops its data path with itself.
	Keeper Keeper
	// Started, when set, counts the role's parts to the end of their start
	// (a node feature's first converged sync, nodeview.Loop). Nil: none
	// counted.
	Started *Started
}

// Takeover holds the first writes of a role's features (internal/handover.Gate).
type Takeover interface {
	Leave()
	Wait(ctx context.Context) bool
	// Claim returns, once the node is this agent's, the files of the data
	// path the running agent kept under name; none when there is none.
	Claim(ctx context.Context, name string) ([]*os.File, error)
}

// Keeper takes a stopped feature's data path into the agent's keeping
// (internal/handover.Parcels): Hand gives it up and returns the files that
// carry it on, Close stops it for good.
type Keeper interface {
	Keep(name string, p interface {
		Hand() ([]*os.File, error)
		Close() error
	})
}

// Source is where the process's configuration came from.
type Source struct {
	// File is the configuration file; "" without one.
	File string
	// Load reads the configuration again from the same flags, environment
	// and file, validated; nil when the configuration came from no flags.
	Load func() (*v1alpha1.Configuration, error)
}

// Func runs a role until ctx is cancelled (a graceful stop, returning nil) or
// it fails (returning the error, which stops the process).
type Func func(ctx context.Context, d Deps) error

// A Role is built from what the process shares into the parts the manager
// runs: most roles are one part on every replica (Whole); the controller's
// loops are a second part that runs only on the elected replica.
type Role func(d Deps) []Runnable

// Whole is a role that is one part, run on every replica.
func Whole(name string, run Func) Role {
	return func(d Deps) []Runnable {
		return []Runnable{{Role: name, Run: func(ctx context.Context) error { return run(ctx, d) }}}
	}
}

// Runnable is a part of a role as controller-runtime's manager runs it: a
// manager.Runnable that says, as a manager.LeaderElectionRunnable, whether
// it runs only on the replica holding the leader election Lease.
type Runnable struct {
	Role    string // named in errors
	Run     func(ctx context.Context) error
	Elected bool
}

// Start runs the part until ctx ends. A part that returns before then has
// failed even without an error: the process would go on without it.
func (r Runnable) Start(ctx context.Context) error {
	err := r.Run(ctx)
	switch {
	case err != nil:
		return fmt.Errorf("role %s: %w", r.Role, err)
	case ctx.Err() == nil:
		return fmt.Errorf("role %s stopped on its own", r.Role)
	}
	return nil
}

// Together runs each of runs side by side until ctx ends or one fails,
// which stops the others, and returns once all returned.
func Together(ctx context.Context, runs ...func(context.Context) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, len(runs))
	for _, run := range runs {
		go func() {
			err := run(ctx)
			if err != nil {
				cancel()
			}
			errs <- err
		}()
	}
	var all []error
	for range runs {
		all = append(all, <-errs)
	}
	return errors.Join(all...)
}

// NeedLeaderElection tells the manager whether the part waits for the Lease.
func (r Runnable) NeedLeaderElection() bool { return r.Elected }

// WaitForSync starts the informer factory and waits until every given
// informer has synced. Until then /readyz reports name as not ready, so a
// role is never ready on a half-filled cache. It returns false when ctx ended
// first. It is told, not polling: client-go's WaitForCacheSync looks every
// 100 ms, which kept every role waiting 50 ms on average after its lists
// were in (more than the proxy's whole first sync at 1,000 Services).
func WaitForSync(ctx context.Context, d Deps, name string, synced ...cache.DoneChecker) bool {
	var done atomic.Bool
	d.Checks.AddReady(name, func() error {
		if !done.Load() {
			return errors.New("informer caches have not synced yet")
		}
		return nil
	})
	d.Checks.started(d.Role)
	if d.Factory != nil {
		d.Factory.Start(ctx)
	}
	if !cache.WaitFor(ctx, "", synced...) {
		return false
	}
	done.Store(true)
	d.Log.Info("caches synced", "role", name)
	return true
}

// ProtobufClient is a client of the process's API server that asks for
// protobuf, which is smaller on the wire and cheaper to decode than JSON:
// roles that list every Service and EndpointSlice use it. Without a rest
// config (tests) it is the shared client.
func (d Deps) ProtobufClient() kubernetes.Interface {
	if d.RestConfig == nil {
		return d.Client
	}
	c, err := kubernetes.NewForConfig(ProtobufConfig(d.RestConfig))
	if err != nil {
		return d.Client
	}
	return c
}

// ProtobufConfig is a copy of c asking for protobuf.
func ProtobufConfig(c *rest.Config) *rest.Config {
	cfg := rest.CopyConfig(c)
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	return cfg
}
