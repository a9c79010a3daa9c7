package scale

import (
	"fmt"
	"net/netip"
	"testing"
)

// TestTheClusterHasItsSizes checks the generated cluster against its
// Sizes: every pod an endpoint of one Service, the big Services their
// endpoints, addresses unique and where the Nodes' pod CIDRs say.
func TestTheClusterHasItsSizes(t *testing.T) {
	small := Sizes{Nodes: 7, Pods: 300, Services: 20, Policies: 40, Namespaces: 4, Big: 2, Headless: 1, BigEndpoints: 50}
	for name, s := range map[string]Sizes{"small": small, "tenth": Tenth, "field": Field} {
		t.Run(name, func(t *testing.T) {
			eps := s.Endpoints()
			seen, total := map[netip.Addr]bool{}, 0
			cluster := netip.MustParsePrefix(ClusterCIDR)
			for k, list := range eps {
				total += len(list)
				if want := s.BigEndpoints; k < s.Big+s.Headless && len(list) != want {
					t.Errorf("Service %d has %d endpoints, want %d", k, len(list), want)
				}
				if len(list) == 0 {
					t.Errorf("Service %d has no endpoints", k)
				}
				for _, e := range list {
					if seen[e.IP] || !cluster.Contains(e.IP) || !PodCIDR(e.Node).Contains(e.IP) {
						t.Fatalf("endpoint %v of Service %d: duplicate, or outside %s or Node %d's %v", e.IP, k, ClusterCIDR, e.Node, PodCIDR(e.Node))
					}
					seen[e.IP] = true
				}
				if got := s.Pod(podIndex(t, list[0].Pod)).Labels["app"]; got != s.ServiceName(k) {
					t.Errorf("Service %d's first endpoint is a pod of %s", k, got)
				}
			}
			if total != s.Pods {
				t.Errorf("%d endpoints, want one per pod (%d)", total, s.Pods)
			}
			if n := len(s.PolicyObjects()); n != s.Policies {
				t.Errorf("%d policies, want %d", n, s.Policies)
			}
			last := s.Policy(s.Namespaces-1, s.Policies/s.Namespaces-1)
			if app := last.Spec.PodSelector.MatchLabels["app"]; app == "" || s.Service(serviceIndex(t, app)).Namespace != last.Namespace {
				t.Errorf("the last policy selects %q, not a Service of its namespace %s", app, last.Namespace)
			}
			if s.podsPerNode() > 250 {
				t.Errorf("%d pods per Node do not fit a /24", s.podsPerNode())
			}
		})
	}
}

func podIndex(t *testing.T, name string) (j int) {
	if _, err := fmt.Sscanf(name, "pod-%d", &j); err != nil {
		t.Fatal(err)
	}
	return j
}

func serviceIndex(t *testing.T, name string) (k int) {
	if _, err := fmt.Sscanf(name, "svc-%d", &k); err != nil {
		t.Fatal(err)
	}
	return k
}
