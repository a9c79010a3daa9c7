package informer

import (
	"context"
	"errors"
	"sync"
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
	fast := outage.Policy{ProbeFirst: time.Millisecond, ProbeMax: time.Millisecond, ProbeTimeout: time.Second, Spread: time.Millisecond}
	gate := outage.New(fast, probeUntil(back, probed), logr.Discard())
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

// probeUntil is a readiness probe failing until back is closed; probed
// hears of each try.
func probeUntil(back <-chan struct{}, probed chan<- struct{}) func(context.Context) error {
	return func(context.Context) error {
		probed <- struct{}{}
		select {
		case <-back:
			return nil
		default:
			return errors.New("connection refused")
		}
	}
}

// recordingSink counts a sink's writes.
type recordingSink struct {
	mu                sync.Mutex
	replaced, deleted int
	last              []any
	replaceSeen       chan struct{}
}

func (s *recordingSink) Add(any) error    { return nil }
func (s *recordingSink) Update(any) error { return nil }
func (s *recordingSink) Delete(any) error { s.note(func() { s.deleted++ }); return nil }
func (s *recordingSink) Resync() error    { return nil }
func (s *recordingSink) Replace(list []any, _ string) error {
	s.note(func() { s.replaced, s.last = s.replaced+1, append([]any(nil), list...) })
	s.replaceSeen <- struct{}{}
	return nil
}

func (s *recordingSink) note(fn func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fn()
}

func (s *recordingSink) counts() (replaced, deleted int, last []any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.replaced, s.deleted, s.last
}

// A custom resource's reflector passes the factory's gate as its own
// informers do: once an outage closed it, the reflector sends nothing
// while the probe fails and its sink keeps what it had, then it lists
// again as soon as the probe answers. The outage lasts 25 probes 100 ms
// apart, longer than a reflector's own first backoff (0.8-1.6 s), after
// which one outside the gate would have listed.
func TestACustomResourceWaitsAtTheGateAndKeepsItsRecords(t *testing.T) {
	back := make(chan struct{})
	probed := make(chan struct{}, 100)
	fast := outage.Policy{ProbeFirst: 100 * time.Millisecond, ProbeMax: 100 * time.Millisecond, ProbeTimeout: time.Second, Spread: time.Millisecond}
	gate := outage.New(fast, probeUntil(back, probed), logr.Discard())
	f := NewWithGate(fake.NewClientset(), gate)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var mu sync.Mutex
	lists := 0
	watches := make(chan *watch.FakeWatcher, 10)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "kept", ResourceVersion: "5"}}
	sink := &recordingSink{replaceSeen: make(chan struct{}, 10)}
	done := f.RunCustom(ctx, Custom{Kind: "configmaps", Name: "test", Example: &corev1.ConfigMap{}, Client: fake.NewClientset(),
		List: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
			mu.Lock()
			defer mu.Unlock()
			lists++
			return &corev1.ConfigMapList{ListMeta: metav1.ListMeta{ResourceVersion: "5"}, Items: []corev1.ConfigMap{*cm}}, nil
		},
		Watch: func(context.Context, metav1.ListOptions) (watch.Interface, error) {
			w := watch.NewFake()
			watches <- w
			return w, nil
		},
		Record: func(o runtime.Object) any { return o.(*corev1.ConfigMap).Name },
		Sink:   sink})
	<-done.Done()
	<-sink.replaceSeen
	w := <-watches

	// Another informer meets the outage; the custom one's watch ends.
	_ = gate.Member(ctx, "other").Do(ctx, func() error { return syscall.ECONNREFUSED })
	w.Stop()
	for range 25 {
		<-probed
	}
	mu.Lock()
	during := lists
	mu.Unlock()
	if replaced, deleted, last := sink.counts(); during != 1 || replaced != 1 || deleted != 0 || len(last) != 1 {
		t.Fatalf("while the probe failed: %d lists, %d replaces, %d deletes, records %v; want 1, 1, 0 and the one record", during, replaced, deleted, last)
	}
	close(back)
	select {
	case <-sink.replaceSeen:
	case <-time.After(10 * time.Second):
		t.Fatal("the custom reflector did not list again once the probe answered")
	}
	if replaced, deleted, last := sink.counts(); replaced != 2 || deleted != 0 || len(last) != 1 || last[0] != "kept" {
		t.Errorf("after the relist: %d replaces, %d deletes, records %v; want 2, 0, [kept]", replaced, deleted, last)
	}
}
