package process

import (
	"context"
	"fmt"
	"os"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/internal/role"
)

// elected runs the parts that need the leader election Lease while this
// process holds it, and campaigns again when it loses it. A process that
// cannot renew (its API server away past --leader-elect-renew-deadline)
// stops those parts, so it never writes without the Lease, but lives on:
// its Lease still names it, so once the API server answers it renews at
// once, where a restarted process (kube-controller-manager exits) would
// wait out the Lease it left behind, and its pod would count a restart
// towards CrashLoopBackOff at every outage. Its informers stay warm
// meanwhile. On the process's stop the parts stop first and the Lease is
// then given up, so a peer takes over at once and never while this one
// writes.
type elected struct {
	cfg   v1alpha1.LeaderElection
	lock  resourcelock.Interface
	parts []role.Runnable
	log   logr.Logger
}

func newElected(cfg v1alpha1.LeaderElection, restConfig *rest.Config, parts []role.Runnable, log logr.Logger) (*elected, error) {
	host, err := os.Hostname()
	if err != nil {
		return nil, err
	}
	id := host + "_" + string(uuid.NewUUID())
	lock, err := resourcelock.NewFromKubeconfig(resourcelock.LeasesResourceLock, cfg.ResourceNamespace, cfg.ResourceName,
		resourcelock.ResourceLockConfig{Identity: id}, rest.CopyConfig(restConfig), cfg.RenewDeadline.Duration)
	if err != nil {
		return nil, fmt.Errorf("leader election: %w", err)
	}
	return &elected{cfg: cfg, lock: lock, parts: parts, log: log.WithValues("lease", cfg.ResourceNamespace+"/"+cfg.ResourceName, "identity", id)}, nil
}

// Start campaigns until ctx ends. It returns a part's error, or nil.
func (e *elected) Start(ctx context.Context) error {
	for {
		err := e.term(ctx)
		if err != nil || ctx.Err() != nil {
			return err
		}
		e.log.Info("leader election lost; the elected parts stopped, campaigning again")
	}
}

// term campaigns once. It returns nil when the Lease was lost or ctx ended
// (then after the parts stopped and the Lease was given up), or the error
// of a part that failed.
func (e *elected) term(ctx context.Context) error {
	// The elector's own context ends only once the parts stopped, so that
	// it gives the Lease up (ReleaseOnCancel) after their last write.
	leCtx, leCancel := context.WithCancel(context.WithoutCancel(ctx))
	defer leCancel()
	leading := make(chan context.Context, 1)
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            e.lock,
		LeaseDuration:   e.cfg.LeaseDuration.Duration,
		RenewDeadline:   e.cfg.RenewDeadline.Duration,
		RetryPeriod:     e.cfg.RetryPeriod.Duration,
		ReleaseOnCancel: true,
		Name:            e.cfg.ResourceName,
		Callbacks: leaderelection.LeaderCallbacks{
			// Its context ends when the Lease is lost.
			OnStartedLeading: func(l context.Context) { leading <- l },
			OnStoppedLeading: func() {},
		},
	})
	if err != nil {
		return fmt.Errorf("leader election: %w", err)
	}
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		le.Run(leCtx)
	}()
	select {
	case lctx := <-leading:
		e.log.Info("leader election won; starting the elected parts")
		pctx, cancel := context.WithCancel(lctx)
		stop := context.AfterFunc(ctx, cancel)
		err = runAll(pctx, e.parts)
		stop()
		cancel()
	case <-ran: // ended before it won
	case <-ctx.Done():
	}
	leCancel()
	<-ran
	return err
}

// runAll runs parts until ctx ends, and stops them all when one fails.
func runAll(ctx context.Context, parts []role.Runnable) error {
	runs := make([]func(context.Context) error, len(parts))
	for i, p := range parts {
		runs[i] = p.Start
	}
	return role.Together(ctx, runs...)
}
