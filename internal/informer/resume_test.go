package informer

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	"github.com/netplane/netplane/internal/outage"
)

// A reflector whose watch met an outage lists again as soon as the probe
// finds the API server back, from its error handler, and not before:
// while the probe fails, it sends nothing.
func TestResumeListsOnceTheProbeAnswersAndNotBefore(t *testing.T) {
	back := make(chan struct{})
	probed := make(chan struct{}, 100)
	probe := func(context.Context) error {
		probed <- struct{}{}
		select {
		case <-back:
			return nil
		default:
			return errors.New("connection refused")
		}
	}
	fast := outage.Policy{ProbeFirst: time.Millisecond, ProbeMax: time.Millisecond, ProbeTimeout: time.Second, Spread: time.Millisecond}
	gate := outage.New(fast, probe, logr.Discard())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m := gate.Member(ctx, "test")

	listed := make(chan struct{}, 1)
	lw := cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
			listed <- struct{}{}
			return &corev1.ServiceList{}, nil
		},
		WatchFuncWithContext: func(context.Context, metav1.ListOptions) (watch.Interface, error) { return watch.NewFake(), nil },
	}, fake.NewClientset())
	r := cache.NewReflectorWithOptions(lw, &corev1.Service{}, cache.NewStore(cache.MetaNamespaceKeyFunc), cache.ReflectorOptions{})

	refused := syscall.ECONNREFUSED
	_ = m.Do(ctx, func() error { return refused })
	done := make(chan struct{})
	go func() {
		resume(m)(ctx, r, outage.ErrUnavailable(refused))
		close(done)
	}()
	for range 3 {
		<-probed
	}
	select {
	case <-listed:
		t.Fatal("the reflector listed while the probe still failed")
	default:
	}
	close(back)
	select {
	case <-listed:
	case <-time.After(10 * time.Second):
		t.Fatal("the reflector did not list once the probe answered")
	}
	cancel()
	<-done
}
