package scale

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
)

// Writers is how many API calls Fill keeps in flight.
const Writers = 48

// Writer is a client for bulk writes: protobuf, no client-side rate limit.
func Writer(cfg *rest.Config) (kubernetes.Interface, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = -1, 0
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	return kubernetes.NewForConfig(cfg)
}

// Fill writes the cluster of s: namespaces, Nodes and Pods with their
// statuses, Services and their EndpointSlices, and NetworkPolicies. extra
// pods (on Node 0, say) are written with the others. It logs its progress
// through logf.
func Fill(ctx context.Context, c kubernetes.Interface, s Sizes, extra []*v1.Pod, logf func(string, ...any)) error {
	step := func(what string, n int, do func(context.Context, int) error) error {
		start := time.Now()
		if err := parallel(ctx, n, do); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		logf("%d %s in %v (%.0f/s)", n, what, time.Since(start).Round(time.Millisecond), float64(n)/time.Since(start).Seconds())
		return nil
	}
	nss := s.NamespaceObjects()
	if err := step("namespaces", len(nss), func(ctx context.Context, i int) error {
		_, err := c.CoreV1().Namespaces().Create(ctx, nss[i], metav1.CreateOptions{})
		return existing(err)
	}); err != nil {
		return err
	}
	if err := step("Nodes", s.Nodes, func(ctx context.Context, i int) error {
		want := s.Node(i)
		n, err := c.CoreV1().Nodes().Create(ctx, want, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			n, err = c.CoreV1().Nodes().Get(ctx, want.Name, metav1.GetOptions{})
		}
		if err != nil {
			return err
		}
		n.Status = want.Status
		_, err = c.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	}); err != nil {
		return err
	}
	if err := step("Pods with their statuses", s.Pods+len(extra), func(ctx context.Context, j int) error {
		want := s.podOrExtra(j, extra)
		p, err := c.CoreV1().Pods(want.Namespace).Create(ctx, want, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			p, err = c.CoreV1().Pods(want.Namespace).Get(ctx, want.Name, metav1.GetOptions{})
		}
		if err != nil {
			return err
		}
		p.Status = want.Status
		_, err = c.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{})
		return err
	}); err != nil {
		return err
	}
	eps := s.Endpoints()
	if err := step("Services with their EndpointSlices", s.Services, func(ctx context.Context, k int) error {
		svc := s.Service(k)
		if _, err := c.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{}); existing(err) != nil {
			return err
		}
		for _, sl := range s.Slices(k, eps[k]) {
			if _, err := c.DiscoveryV1().EndpointSlices(sl.Namespace).Create(ctx, sl, metav1.CreateOptions{}); existing(err) != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return err
	}
	pols := s.PolicyObjects()
	return step("NetworkPolicies", len(pols), func(ctx context.Context, i int) error {
		_, err := c.NetworkingV1().NetworkPolicies(pols[i].Namespace).Create(ctx, pols[i], metav1.CreateOptions{})
		return existing(err)
	})
}

// existing takes an object that already exists as made.
func existing(err error) error {
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

func (s Sizes) podOrExtra(j int, extra []*v1.Pod) *v1.Pod {
	if j < s.Pods {
		return s.Pod(j)
	}
	return extra[j-s.Pods]
}

// parallel runs do(i) for i in [0, n), Writers at a time, and returns the
// first error.
func parallel(ctx context.Context, n int, do func(context.Context, int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(Writers, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				// A loaded API server times some writes out, made or not: each
				// step takes an existing object as made, so try again.
				err := retry.OnError(retry.DefaultBackoff, func(err error) bool { return !apierrors.IsInvalid(err) }, func() error { return do(ctx, i) })
				if err != nil {
					cancel(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return context.Cause(ctx)
}
