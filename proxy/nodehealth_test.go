package proxy

import (
	"net/http"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/netplane/netplane/nodeview"
)

// The answers cloud load balancers and kube-proxy's users rely on.
func TestNodeHealthAnswersAsKubeProxy(t *testing.T) {
	now := time.Date(2026, 11, 28, 3, 0, 0, 0, time.UTC)
	synced := now.Add(-time.Second)
	deleting := &nodeview.Node{Deleting: true}
	draining := &nodeview.Node{Taints: []v1.Taint{{Key: toBeDeletedTaint, Effect: v1.TaintEffectNoSchedule}}}
	for _, tc := range []struct {
		name     string
		path     string
		healthy  bool
		node     *nodeview.Node
		code     int
		eligible *bool
	}{
		{"healthy node", "/healthz", true, &nodeview.Node{}, http.StatusOK, ptrTo(true)},
		{"rules behind", "/healthz", false, &nodeview.Node{}, http.StatusServiceUnavailable, ptrTo(true)},
		{"node being deleted", "/healthz", true, deleting, http.StatusServiceUnavailable, ptrTo(false)},
		{"node drained by the autoscaler", "/healthz", true, draining, http.StatusServiceUnavailable, ptrTo(false)},
		{"node not listed yet", "/healthz", true, nil, http.StatusOK, ptrTo(true)},
		{"livez ignores the node", "/livez", true, deleting, http.StatusOK, nil},
		{"livez follows the rules", "/livez", false, &nodeview.Node{}, http.StatusServiceUnavailable, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, r := nodeHealth(tc.path, tc.healthy, synced, now, tc.node)
			if code != tc.code {
				t.Errorf("status %d, want %d", code, tc.code)
			}
			if (r.NodeEligible == nil) != (tc.eligible == nil) || (r.NodeEligible != nil && *r.NodeEligible != *tc.eligible) {
				t.Errorf("nodeEligible %v, want %v", r.NodeEligible, tc.eligible)
			}
			if r.LastUpdated != "2026-11-28T02:59:59Z" || r.CurrentTime != "2026-11-28T03:00:00Z" {
				t.Errorf("times %q %q", r.LastUpdated, r.CurrentTime)
			}
		})
	}
}
