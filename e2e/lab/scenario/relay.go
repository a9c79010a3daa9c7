package scenario

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netplane/netplane/e2e/lab"
)

// relaySelector selects the chart's pod relays.
const relaySelector = "app.kubernetes.io/name=netplane,app.kubernetes.io/component=relay"

// PodRelays: the node agents read pods from the chart's relays. A lab
// started without them turns them on by helm upgrade, and off again at the
// end. Every agent watches a relay; a pod's label change reaches the
// NetworkPolicy tables through them; once the relay an agent read from is
// deleted, every agent watches one of those left and a label change still
// arrives within the scenario's 10 s.
func PodRelays(ctx context.Context, l *lab.Lab, logf func(string, ...any)) (err error) {
	if l.Config.Stack == lab.StackUpstream {
		return Skipped{"the upstream stack has no pod relays"}
	}
	if !l.PodRelay {
		start := time.Now()
		l.PodRelay = true // the rollout waits for the relays too
		defer func() {
			l.PodRelay = false
			off := time.Now()
			if uerr := l.UpgradeNetplane(ctx, map[string]any{"relay": map[string]any{"enabled": false}}); uerr != nil && err == nil {
				err = fmt.Errorf("helm upgrade, relays off: %w", uerr)
			} else if uerr == nil {
				logf("helm upgrade, relays off: rolled out in %.1fs", time.Since(off).Seconds())
			}
		}()
		if err := l.UpgradeNetplane(ctx, map[string]any{"relay": map[string]any{"enabled": true, "replicas": min(len(l.Nodes), 2)}}); err != nil {
			return fmt.Errorf("helm upgrade, relays on: %w", err)
		}
		logf("helm upgrade, relays on: rolled out in %.1fs", time.Since(start).Seconds())
	}
	by, err := watchedRelays(ctx, l, len(l.Nodes))
	if err != nil {
		return err
	}
	logf("every node agent watches pods on a relay: %v", by)
	if err := labelsFollow(ctx, l, logf); err != nil {
		return err
	}
	// The relay with the most watchers goes; its agents move to another.
	gone := ""
	for pod, n := range by {
		if gone == "" || n > by[gone] {
			gone = pod
		}
	}
	if err := l.Client.CoreV1().Pods(lab.ReleaseNamespace).Delete(ctx, gone, metav1.DeleteOptions{}); err != nil {
		return err
	}
	start := time.Now()
	var after map[string]int
	if err := within(ctx, 90*time.Second, func() error {
		var err error
		if after, err = watchedRelays(ctx, l, len(l.Nodes)); err == nil && after[gone] > 0 {
			err = fmt.Errorf("%s still has %d watchers", gone, after[gone])
		}
		return err
	}); err != nil {
		return fmt.Errorf("after relay %s was deleted: %w", gone, err)
	}
	logf("relay %s deleted: every agent watches another within %.1fs: %v", gone, time.Since(start).Seconds(), after)
	return labelsFollow(ctx, l, logf)
}

// watchedRelays waits until the relays' watchers of pods, counted by
// each ready relay's netplane_relay_watchers, add up to want (one for
// every node agent), and returns them by relay pod.
func watchedRelays(ctx context.Context, l *lab.Lab, want int) (map[string]int, error) {
	var by map[string]int
	err := within(ctx, 90*time.Second, func() error {
		pods, err := l.Client.CoreV1().Pods(lab.ReleaseNamespace).List(ctx, metav1.ListOptions{LabelSelector: relaySelector})
		if err != nil {
			return err
		}
		total := 0
		by = map[string]int{}
		for _, p := range pods.Items {
			if !podReady(&p) || p.DeletionTimestamp != nil {
				continue
			}
			n, err := relayWatchers(ctx, l, &p)
			if err != nil {
				return err
			}
			by[p.Name] = n
			total += n
		}
		if total != want {
			return fmt.Errorf("the relays have %d pod watchers (%v), want %d, one for each node agent", total, by, want)
		}
		return nil
	})
	return by, err
}

// relayWatchers reads a relay pod's netplane_relay_watchers through the
// API server's proxy to its metrics port.
func relayWatchers(ctx context.Context, l *lab.Lab, p *corev1.Pod) (int, error) {
	body, err := l.Client.CoreV1().Pods(p.Namespace).ProxyGet("http", p.Name, "10294", "/metrics", nil).DoRaw(ctx)
	if err != nil {
		return 0, fmt.Errorf("metrics of relay %s: %w", p.Name, err)
	}
	for line := range strings.SplitSeq(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, "netplane_relay_watchers "); ok {
			n, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return int(n), err
		}
	}
	return 0, fmt.Errorf("relay %s has no netplane_relay_watchers", p.Name)
}

// labelsFollow checks that client-other's access label reaches the
// policy tables: denied without it, admitted with it, denied again.
func labelsFollow(ctx context.Context, l *lab.Lab, logf func(string, ...any)) error {
	if err := Apply(ctx, l, "09-network-policy.yaml"); err != nil {
		return err
	}
	if _, err := readyPodsIn(ctx, l, policyNS, "app=nginx", 2); err != nil {
		return err
	}
	if err := running(ctx, l, policyNS, "client-other"); err != nil {
		return err
	}
	for _, label := range []string{"", "true", ""} {
		if err := accessFollows(ctx, l, label, logf); err != nil {
			return err
		}
	}
	return nil
}
