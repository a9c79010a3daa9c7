// Package endpointslice is netplane's EndpointSlice controller role: it keeps
// the EndpointSlices of every Service with a selector true to its Pods, and
// (through controllers/mirroring) mirrors user-written Endpoints of Services
// without a selector into slices. It replaces kube-controller-manager's
// endpointslice and endpointslicemirroring controllers; a cluster runs one or
// the other, never both.
package endpointslice

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcore "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"

	"github.com/netplane/netplane/controllers/internal/kit"
	"github.com/netplane/netplane/controllers/mirroring"
	"github.com/netplane/netplane/internal/role"
)

// Run is the controller role. Caches sync (and /readyz turns ready) on every
// replica; only the elected leader runs the controllers.
func Run(ctx context.Context, d role.Deps) error {
	cfg := d.Config.Controller
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcore.EventSinkImpl{Interface: d.Client.CoreV1().Events("")})
	defer broadcaster.Shutdown()

	budget := kit.NewWriteBudget(cfg.KubeAPIQPS, int(cfg.KubeAPIBurst))
	writer, err := writeClient(d, budget)
	if err != nil {
		return err
	}
	slices, err := New(d.Log.WithName("endpointslice"), writer, d.Informers,
		broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "endpoint-slice-controller"}),
		d.Metrics, Options{MaxEndpointsPerSlice: cfg.MaxEndpointsPerSlice, BatchPeriod: cfg.EndpointUpdatesBatchPeriod.Duration,
			Budget: budget})
	if err != nil {
		return err
	}
	mirror, err := mirroring.New(d.Log.WithName("mirroring"), writer, d.Informers,
		broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "endpointslice-mirroring-controller"}),
		d.Metrics, mirroring.Options{MaxEndpointsPerSubset: cfg.MirroringMaxEndpointsPerSubset})
	if err != nil {
		return err
	}
	f := d.Informers
	if !role.WaitForSync(ctx, d, "controller",
		f.Core().V1().Services().Informer().HasSyncedChecker(),
		f.Core().V1().Pods().Informer().HasSyncedChecker(),
		f.Core().V1().Nodes().Informer().HasSyncedChecker(),
		f.Core().V1().Endpoints().Informer().HasSyncedChecker(),
		f.Discovery().V1().EndpointSlices().Informer().HasSyncedChecker(),
	) {
		return nil
	}
	workers := int(cfg.ConcurrentSyncs)
	run := func(ctx context.Context) {
		var wg sync.WaitGroup
		wg.Go(func() { slices.Run(ctx, workers) })
		wg.Go(func() { mirror.Run(ctx, workers) })
		wg.Wait()
	}
	if !cfg.LeaderElection.LeaderElect {
		run(ctx)
		return nil
	}
	return runElected(ctx, d, run)
}

// writeClient is the client the controllers write slices with: the shared
// connection with the controller section's own rate limits, so that write
// throughput (which bounds how soon a pod change shows in its slice) is set
// apart from the watches other roles in the process share. Its rate limiter
// is budget's: every request it sends (both controllers' creates, updates
// and deletes) takes one token, as with client-go's own limiter, and the
// selector controller's workers reserve their token before dequeuing.
// Events go through d.Client, as before.
func writeClient(d role.Deps, budget *kit.WriteBudget) (kubernetes.Interface, error) {
	rc := rest.CopyConfig(d.RestConfig)
	rc.QPS, rc.Burst = d.Config.Controller.KubeAPIQPS, int(d.Config.Controller.KubeAPIBurst)
	rc.RateLimiter = budget.Limiter()
	c, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("controller client: %w", err)
	}
	return c, nil
}

// errLostLease stops the process when another replica may have taken over:
// continuing would let two replicas write. kube-controller-manager exits the
// same way; the restarted process rejoins the election.
var errLostLease = errors.New("lost the leader election lease; exiting so that only the new leader writes")

// runElected runs run while this replica holds the Lease. It returns nil when
// ctx ends (releasing the Lease so a peer takes over at once) and
// errLostLease when the Lease was lost otherwise.
func runElected(ctx context.Context, d role.Deps, run func(context.Context)) error {
	le := d.Config.Controller.LeaderElection
	id, err := os.Hostname()
	if err != nil {
		return fmt.Errorf("leader election identity: %w", err)
	}
	id += "_" + utilrand.String(8)
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, le.ResourceNamespace, le.ResourceName,
		d.Client.CoreV1(), d.Client.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: id})
	if err != nil {
		return fmt.Errorf("leader election lock %s/%s: %w", le.ResourceNamespace, le.ResourceName, err)
	}
	var lost, started atomic.Bool
	done := make(chan struct{})
	leCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	leaderelection.RunOrDie(leCtx, leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   le.LeaseDuration.Duration,
		RenewDeadline:   le.RenewDeadline.Duration,
		RetryPeriod:     le.RetryPeriod.Duration,
		ReleaseOnCancel: true,
		Name:            le.ResourceName,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				started.Store(true)
				defer close(done)
				d.Log.Info("became leader", "identity", id)
				run(ctx)
			},
			OnStoppedLeading: func() {
				lost.Store(ctx.Err() == nil)
				cancel()
			},
			OnNewLeader: func(who string) {
				if who != id {
					d.Log.Info("another replica leads", "leader", who)
				}
			},
		},
	})
	if started.Load() {
		<-done // stop writing before a successor may start
	}
	if lost.Load() {
		return errLostLease
	}
	return nil
}
