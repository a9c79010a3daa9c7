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

// FollowBudget is how long netplane may take to show a change of a
// Service's ready pods in its EndpointSlices, in DNS and in every node's
// rules, counted from the moment the change reached the API server.
const FollowBudget = time.Second

// ScaleAndReadiness scales the Deployment to 1 and back to 3 and fails one
// pod's readiness. Each time it checks that the EndpointSlices, the headless
// Service's DNS answers and the nodes' rules follow within FollowBudget, and
// that no request reaches a pod that is not ready.
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
	target := net.JoinHostPort(ip, "8080")

	if _, err := follow(ctx, l, logf, "scaled to 1", target, 1, func() error { return scale(ctx, l, 1) }); err != nil {
		return err
	}
	pods, err := follow(ctx, l, logf, "scaled to 3", target, 3, func() error { return scale(ctx, l, 3) })
	if err != nil {
		return err
	}
	failing := pods[0]
	defer l.Exec(context.WithoutCancel(ctx), "default", failing.Name, "/testimage", "get", "http://127.0.0.1/ready?v=true")
	_, err = follow(ctx, l, logf, "readiness of "+failing.Name+" failed", target, 2, func() error {
		_, err := l.Exec(ctx, "default", failing.Name, "/testimage", "get", "http://127.0.0.1/ready?v=false")
		return err
	})
	return err
}

func scale(ctx context.Context, l *lab.Lab, replicas int) error {
	patch := fmt.Sprintf(`{"spec":{"replicas":%d}}`, replicas)
	_, err := l.Client.AppsV1().Deployments("default").Patch(ctx, "nginx", types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

// follow makes a change and waits until nginx has wantReady ready pods in
// the API. From that moment it times the EndpointSlices, the headless
// Service's A records (asked from every node) and the rules of every node
// (requests to target from each node's namespace) until each shows exactly
// those pods, and fails if one took longer than FollowBudget. Then requests
// from the client pod must reach every ready pod and no other.
func follow(ctx context.Context, l *lab.Lab, logf func(string, ...any), what, target string, wantReady int, change func() error) (ready []podInfo, err error) {
	defer func() {
		if err != nil {
			err = fmt.Errorf("%s: %w", what, err)
		}
	}()
	w, err := watchReadyPods(ctx, l, "app=nginx")
	if err != nil {
		return nil, err
	}
	defer w.stop()
	if err := change(); err != nil {
		return nil, err
	}
	ready, changed, err := w.waitFor(ctx, wantReady, 90*time.Second)
	if err != nil {
		return nil, err
	}
	wantIPs, wantPods := podIPsOf(ready), podNamesOf(ready)

	obs := []observer{{"EndpointSlices", func(ctx context.Context) error {
		got, err := readyEndpoints(ctx, l, "nginx")
		if err == nil && !sameStrings(got, wantIPs) {
			err = fmt.Errorf("ready endpoints %v, want %v", got, wantIPs)
		}
		return err
	}}}
	obs = append(obs, perNode(l, "DNS", func(ctx context.Context, n *lab.Node) error {
		got, err := nodeLookup(ctx, l, n, "nginx-pods.default.svc."+lab.ClusterDomain)
		if err == nil && !sameStrings(got, wantIPs) {
			err = fmt.Errorf("nginx-pods has address records %v from %s, want %v", got, n.Name, wantIPs)
		}
		return err
	})...)
	obs = append(obs, perNode(l, "rules", func(ctx context.Context, n *lab.Node) error {
		return onlyReaches(ctx, n, target, wantPods)
	})...)
	timings, seen, err := observe(ctx, changed, obs)
	if err != nil {
		return nil, err
	}
	logf("%s (ready: %v): followed after %s; budget %v", what, wantPods, joinTimings(obs, timings), FollowBudget)
	for i, o := range obs {
		if timings[i] > FollowBudget {
			return nil, fmt.Errorf("%s followed after %v, more than %v; before that it saw: %s", o.name, timings[i], FollowBudget, seen[i])
		}
	}

	url := "http://" + target + "/"
	if _, err := reachAll(ctx, l, url, wantPods); err != nil {
		return nil, err
	}
	allowed := map[string]bool{}
	for _, p := range wantPods {
		allowed[p] = true
	}
	for i := 0; i < 20; i++ {
		pod, err := get(ctx, l, "client", url)
		if err != nil {
			return nil, fmt.Errorf("request %d from the client pod failed: %w", i+1, err)
		}
		if !allowed[pod] {
			return nil, fmt.Errorf("request %d from the client pod reached %s, which is not a ready endpoint", i+1, pod)
		}
	}
	return ready, nil
}
