package endpointslice

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// TestPodChangesMapToServices runs Pod events through the handler, the
// change queue and mapPods, and checks which Services get queued: the same
// sets kube-controller-manager's fan-out computes.
func TestPodChangesMapToServices(t *testing.T) {
	withLabels := func(l map[string]string) podOpt { return func(p *corev1.Pod) { p.Labels = l } }
	cases := []struct {
		name     string
		old, cur *corev1.Pod // old nil: an add
		want     []string
	}{
		{name: "an added pod queues the Services selecting it",
			cur: newPod("a", 0), want: []string{"ns/a", "ns/all"}},
		{name: "prefixed keys and empty values survive the queue",
			cur:  newPod("a", 0, withLabels(map[string]string{"app": "a", "example.com/role": ""})),
			want: []string{"ns/a", "ns/all", "ns/role"}},
		{name: "a deleted pod queues the Services that selected it",
			old: newPod("b", 0), want: []string{"ns/all", "ns/b"}},
		{name: "a readiness change queues its Services",
			old: newPod("a", 0), cur: bumped(newPod("a", 0, notReady)), want: []string{"ns/a", "ns/all"}},
		{name: "a resync (same resourceVersion) queues nothing",
			old: newPod("a", 0), cur: newPod("a", 0)},
		{name: "a change endpoints do not show queues nothing",
			old: newPod("a", 0), cur: bumped(newPod("a", 0, func(p *corev1.Pod) { p.Status.Message = "x" }))},
		{name: "a label change alone queues the Services the pod left and joined",
			old: newPod("a", 0), cur: bumped(newPod("a", 0, withLabels(map[string]string{"app": "b", "tier": "web"}))),
			want: []string{"ns/a", "ns/b"}},
		{name: "a label and readiness change queues every Service of either label set",
			old: newPod("a", 0), cur: bumped(newPod("a", 0, notReady, withLabels(map[string]string{"app": "b", "tier": "web"}))),
			want: []string{"ns/a", "ns/all", "ns/b"}},
		{name: "a pod losing every label leaves its Services",
			old: newPod("a", 0), cur: bumped(newPod("a", 0, withLabels(nil))), want: []string{"ns/a"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fx := newFixture(t, 100)
			all := newService("all")
			all.Spec.Selector = map[string]string{}
			fx.add(newService("a"), newService("b"), all, newService("manual", func(s *corev1.Service) { s.Spec.Selector = nil }),
				newService("role", func(s *corev1.Service) { s.Spec.Selector = map[string]string{"example.com/role": ""} }))
			switch {
			case tc.old == nil:
				fx.c.onPod(nil, tc.cur)
			case tc.cur == nil:
				fx.c.onPod(nil, tc.old)
			default:
				fx.c.onPod(tc.old, tc.cur)
			}
			if got := drainMapped(t, fx.c); !slices.Equal(got, tc.want) {
				t.Errorf("queued %v, want %v", got, tc.want)
			}
		})
	}
}

// TestPodEventBurstDoesNotWaitForMapping: the handler returns at once even
// while no worker maps changes, and equal pending changes are kept once.
func TestPodEventBurstDoesNotWaitForMapping(t *testing.T) {
	fx := newFixture(t, 100)
	fx.add(newService("a"), newService("b"))
	start := time.Now()
	for i := range 10000 {
		app := "a"
		if i%2 == 1 {
			app = "b"
		}
		fx.c.onPod(newPod(app, i), bumped(newPod(app, i, notReady)))
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("10,000 pod events took %v in the handler", d)
	}
	if n := len(fx.c.podChanges.order); n != 2 {
		t.Errorf("%d pending changes, want 2 (one per label set)", n)
	}
	if fx.c.idle() {
		t.Error("controller idle with pod changes pending")
	}
	if got := drainMapped(t, fx.c); !slices.Equal(got, []string{"ns/a", "ns/b"}) {
		t.Errorf("queued %v", got)
	}
}

// bumped is p as the next version the informer delivers.
func bumped(p *corev1.Pod) *corev1.Pod {
	p = p.DeepCopy()
	p.ResourceVersion = "2"
	return p
}

// drainMapped runs mapPods until the changes are mapped and returns the
// Service keys it queued, sorted.
func drainMapped(t *testing.T, c *Controller) []string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.mapPods(ctx)
	}()
	_ = wait.PollUntilContextTimeout(ctx, time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return c.podChanges.idle(), nil
	}) // the caller checks what was mapped
	cancel()
	<-done
	var got []string
	q := c.queue.Current()
	for q.Len() > 0 {
		k, _ := q.Get()
		got = append(got, k)
		q.Done(k)
	}
	slices.Sort(got)
	return got
}
