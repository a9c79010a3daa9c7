package dns

import (
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// dnsIndex is an index holding kube-system/kube-dns with the given
// endpoints.
func dnsIndex(t *testing.T, eps ...ep) *Index {
	return buildIndex(t, fixtureObjects{
		namespaces: []string{"kube-system"},
		services:   []*corev1.Service{clusterIPService("kube-system", "kube-dns", []string{"10.96.0.10"}, httpPort())},
		slices:     []*discoveryv1.EndpointSlice{slice("kube-system", "kube-dns-a", "kube-dns", discoveryv1.AddressTypeIPv4, httpSlicePorts(), eps...)},
	})
}

func TestTheLameDuckLastsWhileTheServerIsAReadyEndpoint(t *testing.T) {
	kubeDNS := svcKey{"kube-system", "kube-dns"}
	own := []netip.Addr{netip.MustParseAddr("10.244.0.5"), netip.MustParseAddr("fd00::5")}
	for _, c := range []struct {
		name string
		ix   *Index
		svc  svcKey
		want bool
	}{
		{"ready endpoint", dnsIndex(t, ep{"10.244.0.5", "", true}, ep{"10.244.1.5", "", true}), kubeDNS, true},
		{"terminating, not ready", dnsIndex(t, ep{"10.244.0.5", "", false}, ep{"10.244.1.5", "", true}), kubeDNS, false},
		{"gone from the slices", dnsIndex(t, ep{"10.244.1.5", "", true}), kubeDNS, false},
		{"another Service", dnsIndex(t, ep{"10.244.0.5", "", true}), svcKey{"kube-system", "other"}, false},
		{"no index yet", nil, kubeDNS, false},
		{"not synced", NewIndex(), kubeDNS, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := stillServing(c.ix, c.svc, own); got != c.want {
				t.Errorf("stillServing = %v, want %v", got, c.want)
			}
		})
	}
}

func TestTheLameDuckWaitsForTheEndpointToGoThenSettles(t *testing.T) {
	serving := dnsIndex(t, ep{"10.244.0.5", "", true})
	gone := dnsIndex(t, ep{"10.244.0.5", "", false})
	own := []netip.Addr{netip.MustParseAddr("10.244.0.5")}
	for _, c := range []struct {
		name          string
		goneAfter     time.Duration // the index drops the endpoint then; 0: never serving
		least, atMost time.Duration
	}{
		{"not an endpoint: the minimum only", 0, 100 * time.Millisecond, 250 * time.Millisecond},
		{"dropped after the minimum: then settle", 400 * time.Millisecond, 500 * time.Millisecond, 900 * time.Millisecond},
		{"never dropped: until the maximum", time.Hour, time.Second, 1300 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			var cur atomic.Pointer[Index]
			cur.Store(gone)
			if c.goneAfter > 0 {
				cur.Store(serving)
				time.AfterFunc(c.goneAfter, func() { cur.Store(gone) })
			}
			start := time.Now()
			lameDuck{min: 100 * time.Millisecond, max: time.Second, settle: 200 * time.Millisecond, service: svcKey{"kube-system", "kube-dns"},
				own: own, index: cur.Load, poll: 10 * time.Millisecond}.wait(logr.Discard())
			if took := time.Since(start); took < c.least || took > c.atMost {
				t.Errorf("answered for %v after SIGTERM, want %v to %v", took, c.least, c.atMost)
			}
		})
	}
}
