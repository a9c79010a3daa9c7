// Package endpointslice is netplane's EndpointSlice controller role: it keeps
// the EndpointSlices of every Service with a selector true to its Pods, and
// (through controllers/mirroring) mirrors user-written Endpoints of Services
// without a selector into slices. It replaces kube-controller-manager's
// endpointslice and endpointslicemirroring controllers; a cluster runs one or
// the other, never both.
package endpointslice

import (
	"context"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcore "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/controllers/internal/kit"
	"github.com/netplane/netplane/controllers/mirroring"
	"github.com/netplane/netplane/internal/role"
)

// Role is the controller role as the manager runs it, in two parts. Its
// views of the process's informers are registered here, as the process
// builds the role. The first part builds the controllers, whose caches sync
// (and /readyz turns ready) on every replica, so a replica that takes over
// has warm caches. The second runs the controllers' loops and needs the
// leader election Lease: only one replica writes.
func Role(d role.Deps) []role.Runnable {
	r := &controllerRole{d: d, synced: make(chan struct{}), views: kit.RegisterViews(d.Factory, Indexers())}
	return []role.Runnable{
		{Role: v1alpha1.RoleController, Run: r.sync},
		{Role: v1alpha1.RoleController, Run: r.lead, Elected: true},
	}
}

type controllerRole struct {
	d     role.Deps
	views kit.Views
	// synced is closed once the fields below are set and the caches synced.
	synced      chan struct{}
	broadcaster record.EventBroadcaster
	slices      *Controller
	mirror      *mirroring.Controller
}

// sync starts the informers, builds the controllers on their views and
// waits for the caches.
func (r *controllerRole) sync(ctx context.Context) error {
	d, cfg := r.d, r.d.Config.Controller
	d.Factory.Start(ctx)
	// Only the loops record events: the leading part starts and stops the
	// broadcaster, which may outlive this part during a stop.
	r.broadcaster = record.NewBroadcaster()
	budget := kit.NewWriteBudget(cfg.KubeAPIQPS, int(cfg.KubeAPIBurst))
	writer, err := writeClient(d, budget)
	if err != nil {
		return err
	}
	src := r.views.Sources()
	r.slices, err = New(d.Log.WithName("endpointslice"), writer, src,
		r.broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "endpoint-slice-controller"}),
		d.Metrics, Options{MaxEndpointsPerSlice: cfg.MaxEndpointsPerSlice, BatchPeriod: cfg.EndpointUpdatesBatchPeriod.Duration,
			Budget: budget})
	if err != nil {
		return err
	}
	r.mirror, err = mirroring.New(d.Log.WithName("mirroring"), writer, src,
		r.broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "endpointslice-mirroring-controller"}),
		d.Metrics, mirroring.Options{MaxEndpointsPerSubset: cfg.MirroringMaxEndpointsPerSubset})
	if err != nil {
		return err
	}
	synced := append(append(r.views.Synced(), r.slices.Synced()...), r.mirror.Synced()...)
	if !role.WaitForSync(ctx, d, v1alpha1.RoleController, synced...) {
		return nil
	}
	close(r.synced)
	<-ctx.Done()
	return nil
}

// lead runs the controllers once the caches synced, until ctx ends: the
// manager starts it on election, and a lost Lease ends the process.
func (r *controllerRole) lead(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return nil
	case <-r.synced:
	}
	r.d.Log.Info("leading: the controllers run")
	r.broadcaster.StartRecordingToSink(&typedcore.EventSinkImpl{Interface: r.d.Client.CoreV1().Events("")})
	defer r.broadcaster.Shutdown()
	workers := int(r.d.Config.Controller.ConcurrentSyncs)
	var wg sync.WaitGroup
	wg.Go(func() { r.slices.Run(ctx, workers) })
	wg.Go(func() { r.mirror.Run(ctx, workers) })
	wg.Wait()
	return nil
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
