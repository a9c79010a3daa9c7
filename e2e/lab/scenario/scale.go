package scenario

import (
	"context"
	"fmt"
	"net"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/netplane/netplane/e2e/lab"
)

// ScaleAndReadiness scales the Deployment to 1 and back to 3 and fails one
// pod's readiness, each time measuring how long the EndpointSlices, the
// headless Service's DNS answers and the nodes' rules (what the requests
// reach) take to follow, and checking that no request reaches a pod that
// is not ready.
func ScaleAndReadiness(ctx context.Context, l *lab.Lab, logf func(string, ...any)) error {
	if err := Apply(ctx, l, "01-clusterip.yaml"); err != nil {
		return err
	}
	if _, err := readyPods(ctx, l, "app=nginx", 3); err != nil {
		return err
	}
	ip, err := clusterIP(ctx, l, "nginx")
	if err != nil {
		return err
	}
	url := "http://" + net.JoinHostPort(ip, "8080") + "/"

	if err := scale(ctx, l, 1); err != nil {
		return err
	}
	pods, err := readyPods(ctx, l, "app=nginx", 1)
	if err != nil {
		return err
	}
	if err := follow(ctx, l, logf, "scaled to 1", podIPs(pods), names(pods), url); err != nil {
		return err
	}

	if err := scale(ctx, l, 3); err != nil {
		return err
	}
	if pods, err = readyPods(ctx, l, "app=nginx", 3); err != nil {
		return err
	}
	if err := follow(ctx, l, logf, "scaled to 3", podIPs(pods), names(pods), url); err != nil {
		return err
	}

	failing := pods[0]
	if _, err := l.Exec(ctx, "default", failing.Name, "/testimage", "get", "http://127.0.0.1/ready?v=false"); err != nil {
		return err
	}
	defer l.Exec(context.WithoutCancel(ctx), "default", failing.Name, "/testimage", "get", "http://127.0.0.1/ready?v=true")
	rest := pods[1:]
	return follow(ctx, l, logf, "readiness of "+failing.Name+" failed", podIPs(rest), names(rest), url)
}

func scale(ctx context.Context, l *lab.Lab, replicas int) error {
	patch := fmt.Sprintf(`{"spec":{"replicas":%d}}`, replicas)
	_, err := l.Client.AppsV1().Deployments("default").Patch(ctx, "nginx", types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

// follow measures the time until the EndpointSlices, DNS and the traffic
// show exactly the wanted pods, then sends 20 more requests that must all
// reach one of them.
func follow(ctx context.Context, l *lab.Lab, logf func(string, ...any), what string, wantIPs, wantPods []string, url string) error {
	start := time.Now()
	if err := within(ctx, 30*time.Second, func() error {
		got, err := readyEndpoints(ctx, l, "nginx")
		if err == nil && !sameStrings(got, wantIPs) {
			err = fmt.Errorf("ready endpoints %v, want %v", got, wantIPs)
		}
		return err
	}); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	slices := time.Since(start)
	if err := within(ctx, 30*time.Second, func() error {
		got, err := lookup(ctx, l, "client", "A", "nginx-pods")
		if err == nil && !sameStrings(got, wantIPs) {
			err = fmt.Errorf("nginx-pods has A records %v, want %v", got, wantIPs)
		}
		return err
	}); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	dns := time.Since(start)
	allowed := map[string]bool{}
	for _, p := range wantPods {
		allowed[p] = true
	}
	onlyReady := func(n int) error {
		for i := 0; i < n; i++ {
			pod, err := get(ctx, l, "client", url)
			if err != nil {
				return fmt.Errorf("request %d failed: %w", i+1, err)
			}
			if !allowed[pod] {
				return fmt.Errorf("request %d reached %s, which is not a ready endpoint", i+1, pod)
			}
		}
		return nil
	}
	// The rules have followed once 10 requests in a row reach only ready
	// pods; they did so when the first of those 10 was sent.
	var rules time.Duration
	if err := within(ctx, 30*time.Second, func() error {
		rules = time.Since(start)
		return onlyReady(10)
	}); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if _, err := reachAll(ctx, l, url, wantPods); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if err := onlyReady(20); err != nil {
		return fmt.Errorf("%s, after the rules followed: %w", what, err)
	}
	logf("%s: EndpointSlices after %v, DNS after %v, traffic only to %v after %v",
		what, slices.Round(time.Millisecond), dns.Round(time.Millisecond), wantPods, rules.Round(time.Millisecond))
	return nil
}
