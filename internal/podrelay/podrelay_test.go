package podrelay

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
)

func slice(name string, ports []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) discoveryv1.EndpointSlice {
	return discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: "netplane-relay"}},
		Ports:      ports, Endpoints: eps,
	}
}

func ep(addr string, ready *bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Addresses: []string{addr}, Conditions: discoveryv1.EndpointConditions{Ready: ready}}
}

func port(name string, n int32) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: ptr.To(name), Port: ptr.To(n)}
}

func TestTheReadyRelaysAreTheReadyEndpointsOnTheRelayPort(t *testing.T) {
	for _, tc := range []struct {
		name   string
		slices []discoveryv1.EndpointSlice
		want   []string
	}{
		{"ready, unknown and not ready", []discoveryv1.EndpointSlice{slice("s", []discoveryv1.EndpointPort{port(PortName, 10292)},
			ep("10.0.0.1", ptr.To(true)), ep("10.0.0.2", nil), ep("10.0.0.3", ptr.To(false)))}, []string{"10.0.0.1:10292", "10.0.0.2:10292"}},
		{"the named port among others", []discoveryv1.EndpointSlice{slice("s", []discoveryv1.EndpointPort{port("metrics", 10291), port(PortName, 10292)},
			ep("10.0.0.1", nil))}, []string{"10.0.0.1:10292"}},
		{"one unnamed port", []discoveryv1.EndpointSlice{slice("s", []discoveryv1.EndpointPort{{Port: ptr.To(int32(7000))}}, ep("fd00::1", nil))}, []string{"[fd00::1]:7000"}},
		{"several ports, none named relay", []discoveryv1.EndpointSlice{slice("s", []discoveryv1.EndpointPort{port("a", 1), port("b", 2)}, ep("10.0.0.1", nil))}, nil},
		{"two slices", []discoveryv1.EndpointSlice{slice("v4", []discoveryv1.EndpointPort{port(PortName, 1)}, ep("10.0.0.1", nil)),
			slice("v6", []discoveryv1.EndpointPort{port(PortName, 1)}, ep("fd00::1", nil))}, []string{"10.0.0.1:1", "[fd00::1]:1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Ready(tc.slices); !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestEachNodeHasItsOwnOrderAndARelayGoingMovesOnlyItsNodes(t *testing.T) {
	relays := []string{"10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1", "10.0.0.4:1"}
	first := map[string]int{}
	moved := 0
	for i := range 1000 {
		node := fmt.Sprint("node-", i)
		o := Order(relays, node)
		reversed := slices.Clone(relays)
		slices.Reverse(reversed)
		if !slices.Equal(o, Order(reversed, node)) {
			t.Fatalf("%s: the order depends on the endpoints' order", node)
		}
		first[o[0]]++
		without := Order(relays[1:], node)
		if o[0] != relays[0] && without[0] != o[0] {
			moved++
		}
	}
	for _, r := range relays {
		if first[r] < 150 {
			t.Errorf("relay %s is first for %d of 1,000 nodes: not spread (%v)", r, first[r], first)
		}
	}
	if moved > 0 {
		t.Errorf("%d nodes whose relay stayed moved when another went", moved)
	}
}

func TestARequestGoesToTheNodesRelayAndToTheNextWhenItFails(t *testing.T) {
	var hits []string
	up := map[string]bool{}
	var addrs []string
	for range 3 {
		var me string
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			hits = append(hits, me)
			if !up[me] {
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			_, _ = w.Write([]byte("ok"))
		}))
		t.Cleanup(srv.Close)
		me = strings.TrimPrefix(srv.URL, "http://")
		addrs, up[me] = append(addrs, me), true
	}
	var eps []discoveryv1.Endpoint
	for _, a := range addrs {
		eps = append(eps, ep(strings.Split(a, ":")[0], nil))
	}
	// Each test server has its own port: one slice per server.
	var objs []discoveryv1.EndpointSlice
	for i, a := range addrs {
		var n int32
		_, _ = fmt.Sscanf(strings.Split(a, ":")[1], "%d", &n)
		objs = append(objs, slice(fmt.Sprint("s", i), []discoveryv1.EndpointPort{port(PortName, n)}, eps[i]))
	}
	api := fake.NewClientset(&objs[0], &objs[1], &objs[2])
	p := &Picker{api: api, namespace: "kube-system", service: "netplane-relay", node: "node-7", next: http.DefaultTransport}
	order := Order(addrs, "node-7")
	get := func() string {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, "http://relay/api/v1/pods", nil)
		resp, err := p.RoundTrip(req)
		if err != nil {
			return "error"
		}
		_ = resp.Body.Close()
		return fmt.Sprint(resp.StatusCode)
	}
	if got := get(); got != "200" || hits[0] != order[0] {
		t.Fatalf("first request: %s at %s, want 200 at the node's relay %s", got, hits[0], order[0])
	}
	up[order[0]] = false
	if got := get(); got != "503" {
		t.Fatalf("the node's relay down: %s", got)
	}
	if got := get(); got != "200" || hits[len(hits)-1] != order[1] {
		t.Fatalf("after the failure: %s at %s, want 200 at %s", got, hits[len(hits)-1], order[1])
	}
}
