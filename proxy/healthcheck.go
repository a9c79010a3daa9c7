package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
)

// healthServers answer on each externalTrafficPolicy=Local Service's
// healthCheckNodePort, so a cloud load balancer sends traffic only to nodes
// with a local endpoint: 200 when there is one and the proxy is healthy,
// 503 otherwise, with kube-proxy's JSON body and weight header.
type healthServers struct {
	log     logr.Logger
	healthy func() bool
	mu      sync.Mutex
	info    map[types.NamespacedName]HealthInfo
	servers map[uint16]*healthServer
}

type healthServer struct {
	svc types.NamespacedName
	srv *http.Server
}

func newHealthServers(log logr.Logger, healthy func() bool) *healthServers {
	return &healthServers{log: log, healthy: healthy, info: map[types.NamespacedName]HealthInfo{}, servers: map[uint16]*healthServer{}}
}

// Sync opens listeners for new ports, closes those no longer used and
// updates the counts the handlers report.
func (h *healthServers) Sync(want map[types.NamespacedName]HealthInfo) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.info = want
	byPort := map[uint16]types.NamespacedName{}
	for svc, hi := range want {
		byPort[hi.Port] = svc
	}
	for port, s := range h.servers {
		if svc, ok := byPort[port]; !ok || svc != s.svc {
			_ = s.srv.Close()
			delete(h.servers, port)
		}
	}
	for port, svc := range byPort {
		if h.servers[port] != nil {
			continue
		}
		l, err := net.Listen("tcp", ":"+strconv.Itoa(int(port)))
		if err != nil {
			h.log.Error(err, "cannot serve the health-check node port; load balancers will see this node as down", "service", svc, "port", port)
			continue
		}
		srv := &http.Server{Handler: h.handler(svc), ReadHeaderTimeout: 5 * time.Second}
		h.servers[port] = &healthServer{svc: svc, srv: srv}
		go func() { _ = srv.Serve(l) }()
	}
}

func (h *healthServers) handler(svc types.NamespacedName) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		h.mu.Lock()
		n := h.info[svc].LocalEndpoints
		h.mu.Unlock()
		healthy := h.healthy()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("X-Load-Balancing-Endpoint-Weight", strconv.Itoa(n))
		if n > 0 && healthy {
			w.WriteHeader(http.StatusOK)
		} else {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		body := map[string]any{
			"service":             map[string]string{"namespace": svc.Namespace, "name": svc.Name},
			"localEndpoints":      n,
			"serviceProxyHealthy": healthy,
		}
		_ = json.NewEncoder(w).Encode(body)
	})
}

// Close stops every listener.
func (h *healthServers) Close(ctx context.Context) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for port, s := range h.servers {
		_ = s.srv.Shutdown(ctx)
		delete(h.servers, port)
	}
}

func (h *healthServers) String() string {
	return fmt.Sprintf("%d health-check node ports", len(h.servers))
}
