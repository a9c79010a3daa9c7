package controllers

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/controllers/internal/kit"
	"github.com/netplane/netplane/internal/role"
)

// TestWriteClientTakesEveryRequestFromTheBudget: the role's write client
// must be limited by the controllers' budget and by nothing else; a shared
// config that never limits must not leak through, and no write may skip
// the budget.
func TestWriteClientTakesEveryRequestFromTheBudget(t *testing.T) {
	var seen atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":"x","namespace":"ns"},"addressType":"IPv4","endpoints":[]}`))
	}))
	defer srv.Close()
	cfg := v1alpha1.Default()
	d := role.Deps{Config: cfg, RestConfig: &rest.Config{Host: srv.URL, RateLimiter: flowcontrol.NewFakeAlwaysRateLimiter()}}
	c, err := writeClient(d, kit.NewWriteBudget(10, 1))
	if err != nil {
		t.Fatal(err)
	}
	api := c.DiscoveryV1().EndpointSlices("ns")
	s := &discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "x", Namespace: "ns"}, AddressType: discovery.AddressTypeIPv4}
	start := time.Now()
	for range 2 {
		if _, err := api.Create(context.Background(), s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := api.Delete(context.Background(), "x", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 180*time.Millisecond {
		t.Errorf("3 writes at 10/s, burst 1, took %v, want about 200 ms", took)
	}
	if n := seen.Load(); n != 3 {
		t.Errorf("server saw %d requests, want 3", n)
	}
}
