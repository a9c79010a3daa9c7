// Package controllers is netplane's controller role: it runs the
// EndpointSlice controller (controllers/endpointslice), which keeps the
// EndpointSlices of every Service with a selector true to its Pods, and the
// mirroring controller (controllers/mirroring), which mirrors user-written
// Endpoints of Services without a selector into slices. They replace
// kube-controller-manager's endpointslice and endpointslicemirroring
// controllers; a cluster runs one or the other, never both.
package controllers

import (
	"context"
	"errors"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcore "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/controllers/endpointslice"
	"github.com/netplane/netplane/controllers/internal/kit"
	"github.com/netplane/netplane/controllers/mirroring"
	"github.com/netplane/netplane/internal/role"
)

// Event sources, as kube-controller-manager names its two controllers.
var (
	slicesSource = corev1.EventSource{Component: "endpoint-slice-controller"}
	mirrorSource = corev1.EventSource{Component: "endpointslice-mirroring-controller"}
)

// Role is the controller role as the manager runs it, in two parts. Its
// views of the process's informers are registered here, as the process
// builds the role. The first part builds the controllers, whose caches sync
// (and /readyz turns ready) on every replica, so a replica that takes over
// has warm caches. The second runs the controllers' loops and needs the
// leader election Lease: only one replica writes.
func Role(d role.Deps) []role.Runnable {
	r := &controllerRole{d: d, synced: make(chan struct{}), views: kit.RegisterViews(d.Factory, endpointslice.Indexers())}
	return []role.Runnable{
		{Role: v1alpha1.RoleController, Run: r.sync},
		{Role: v1alpha1.RoleController, Run: r.lead, Elected: true},
	}
}

type controllerRole struct {
	d     role.Deps
	views kit.Views
	// synced is closed once the controllers are built and the caches synced.
	synced chan struct{}
	slices *endpointslice.Controller
	mirror *mirroring.Controller
	// The controllers record events through these for their whole life;
	// each run of lead points them at its own broadcaster.
	slicesEvents, mirrorEvents switchRecorder
	// leading is held while lead runs: the controllers run once at a time.
	leading sync.Mutex
}

// sync starts the informers, builds the controllers on their views and
// waits for the caches.
func (r *controllerRole) sync(ctx context.Context) error {
	d, cfg := r.d, r.d.Config.Controller
	d.Factory.Start(ctx)
	budget := kit.NewWriteBudget(cfg.KubeAPIQPS, int(cfg.KubeAPIBurst))
	writer, err := writeClient(d, budget)
	if err != nil {
		return err
	}
	src := r.views.Sources()
	r.slices, err = endpointslice.New(d.Log.WithName("endpointslice"), writer, src, &r.slicesEvents,
		d.Metrics, endpointslice.Options{MaxEndpointsPerSlice: cfg.MaxEndpointsPerSlice, BatchPeriod: cfg.EndpointUpdatesBatchPeriod.Duration,
			Budget: budget})
	if err != nil {
		return err
	}
	r.mirror, err = mirroring.New(d.Log.WithName("mirroring"), writer, src, &r.mirrorEvents,
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
// manager starts it on election and cancels it when the Lease is lost or
// the process stops. It may be called again after it returned, for a
// replica that campaigns again: each call builds its own event
// broadcaster (one that was shut down drops what it is given), and the
// controllers build their own work queues (kit.Loop).
func (r *controllerRole) lead(ctx context.Context) error {
	if !r.leading.TryLock() {
		return errors.New("the controllers already run")
	}
	defer r.leading.Unlock()
	select {
	case <-ctx.Done():
		return nil
	case <-r.synced:
	}
	r.d.Log.Info("leading: the controllers run")
	events := record.NewBroadcaster()
	events.StartRecordingToSink(&typedcore.EventSinkImpl{Interface: r.d.Client.CoreV1().Events("")})
	r.slicesEvents.use(events.NewRecorder(scheme.Scheme, slicesSource))
	r.mirrorEvents.use(events.NewRecorder(scheme.Scheme, mirrorSource))
	defer func() {
		// A replica that does not lead records nothing.
		r.slicesEvents.use(nil)
		r.mirrorEvents.use(nil)
		events.Shutdown()
	}()
	workers := int(r.d.Config.Controller.ConcurrentSyncs)
	var wg sync.WaitGroup
	wg.Go(func() { r.slices.Run(ctx, workers) })
	wg.Go(func() { r.mirror.Run(ctx, workers) })
	wg.Wait()
	r.d.Log.Info("no longer leading: the controllers stopped")
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
