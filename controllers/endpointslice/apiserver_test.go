package endpointslice

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/netplane/netplane/controllers/internal/kit"
	"github.com/netplane/netplane/e2e/apitest"
	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/internal/informer"
)

// The integration tests share one etcd + kube-apiserver (started on first
// use) and give each test its own namespace; no garbage collector or
// kubelet runs, so the tests set pod status themselves.
func TestMain(m *testing.M) { framework.RunShared(m) }

// The harness of apitest under the names these tests use.
var (
	countingConfig = apitest.CountingConfig
	newNamespace   = apitest.NewNamespace
	createNode     = apitest.CreateNode
	createPod      = apitest.CreatePod
	createService  = apitest.CreateService
	listOwn        = apitest.ListOwn
	endpointNames  = apitest.EndpointNames
	newService     = apitest.Service
	newPod         = apitest.Pod
	newNode        = apitest.Node
)

type (
	svcOpt = apitest.ServiceOpt
	podOpt = apitest.PodOpt
)

// waitEndpoints waits until our slices of svc list exactly the want pods,
// each once.
func waitEndpoints(t *testing.T, s *framework.APIServer, ns, svc string, want int) {
	t.Helper()
	apitest.WaitEndpoints(t, s, ns, svc, ControllerName, want)
}

// running is an in-process controller under test.
type running struct {
	c      *Controller
	writes *apitest.WriteCounter
}

// startController runs a Controller (without leader election) until the
// test ends.
func startController(t *testing.T, s *framework.APIServer, opts Options) *running {
	t.Helper()
	cfg, writes := countingConfig(s.RestConfig)
	client := kubernetes.NewForConfigOrDie(cfg)
	f := informer.New(client)
	views := kit.RegisterViews(f, Indexers())
	if opts.MaxEndpointsPerSlice == 0 {
		opts.MaxEndpointsPerSlice = 100
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() {
		cancel()
		<-done
	})
	f.Start(ctx)
	c, err := New(logrDiscard(), client, views.Sources(), record.NewFakeRecorder(1000), prometheus.NewRegistry(), opts)
	if err != nil {
		close(done)
		t.Fatal(err)
	}
	if !cache.WaitFor(ctx, "", append(views.Synced(), c.Synced()...)...) {
		close(done)
		t.Fatal("the controller's caches did not sync")
	}
	go func() {
		defer close(done)
		c.Run(ctx, 5)
	}()
	return &running{c: c, writes: writes}
}

// settle waits until the controller has been idle (empty queue, no sync in
// progress) for longer than its slice-event delay, so that write counts
// are final.
func (r *running) settle(t *testing.T) {
	t.Helper()
	var idleSince time.Time
	framework.Eventually(t, 30*time.Second, "controller idle", func() error {
		if !r.c.idle() {
			idleSince = time.Time{}
			return fmt.Errorf("queue length %d", r.c.queue.Len())
		}
		if idleSince.IsZero() {
			idleSince = time.Now()
		}
		if idle := time.Since(idleSince); idle <= sliceChangeMinDelay+500*time.Millisecond {
			return fmt.Errorf("idle for %v only", idle)
		}
		return nil
	})
}
