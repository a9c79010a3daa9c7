package proxy

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
)

func freePort(t *testing.T) uint16 {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return uint16(l.Addr().(*net.TCPAddr).Port)
}

func TestHealthCheckNodePortAnswersLikeKubeProxy(t *testing.T) {
	var healthy atomic.Bool
	healthy.Store(true)
	h := newHealthServers(logr.Discard(), healthy.Load)
	defer h.Close(t.Context())
	port := freePort(t)
	svc := types.NamespacedName{Namespace: "ns", Name: "web"}
	get := func() (int, map[string]any, string) {
		t.Helper()
		c := http.Client{Timeout: 2 * time.Second}
		resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/", port))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, body, resp.Header.Get("X-Load-Balancing-Endpoint-Weight")
	}

	h.Sync(map[types.NamespacedName]HealthInfo{svc: {Port: port, LocalEndpoints: 2}})
	code, body, weight := get()
	if code != 200 || body["localEndpoints"] != float64(2) || body["serviceProxyHealthy"] != true || weight != "2" {
		t.Errorf("two local endpoints: got %d %v weight %q, want 200, localEndpoints 2, weight 2", code, body, weight)
	}
	if s, _ := body["service"].(map[string]any); s["namespace"] != "ns" || s["name"] != "web" {
		t.Errorf("service in body: %v", body["service"])
	}

	h.Sync(map[types.NamespacedName]HealthInfo{svc: {Port: port, LocalEndpoints: 0}})
	if code, body, _ := get(); code != 503 || body["localEndpoints"] != float64(0) {
		t.Errorf("no local endpoint: got %d %v, want 503", code, body)
	}

	h.Sync(map[types.NamespacedName]HealthInfo{svc: {Port: port, LocalEndpoints: 1}})
	healthy.Store(false)
	if code, body, _ := get(); code != 503 || body["serviceProxyHealthy"] != false {
		t.Errorf("unhealthy proxy: got %d %v, want 503", code, body)
	}

	h.Sync(nil)
	if _, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second); err == nil {
		t.Error("the port still answers after its Service went away")
	}
}
