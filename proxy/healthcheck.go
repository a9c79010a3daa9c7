package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"

	"github.com/netplane/netplane/internal/listen"
)

// HealthInfo is what the health-check node port of one Service reports,
// and where it listens.
type HealthInfo struct {
	Port           uint16
	LocalEndpoints int
	Addrs          []netip.Addr // see NodeFacts.HealthCheckIPs
}

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
	svc   types.NamespacedName
	where string // the listen addresses, to notice a change
	srvs  []*http.Server
	// lns are the servers' listeners, closed here too: a server shut down
	// before its goroutine reached Serve would close its listener only
	// later, and the port would still be taken when it is opened again.
	lns []net.Listener
}

func newHealthServers(log logr.Logger, healthy func() bool) *healthServers {
	return &healthServers{log: log, healthy: healthy, info: map[types.NamespacedName]HealthInfo{}, servers: map[uint16]*healthServer{}}
}

// Sync opens listeners for new ports, closes those no longer used, moves
// those whose addresses changed, and updates the counts the handlers report.
func (h *healthServers) Sync(want map[types.NamespacedName]HealthInfo) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.info = want
	byPort := map[uint16]types.NamespacedName{}
	for svc, hi := range want {
		byPort[hi.Port] = svc
	}
	for port, s := range h.servers {
		if svc, ok := byPort[port]; !ok || svc != s.svc || s.where != fmt.Sprint(want[svc].Addrs) {
			s.close()
			delete(h.servers, port)
		}
	}
	for port, svc := range byPort {
		if h.servers[port] != nil {
			continue
		}
		s := &healthServer{svc: svc, where: fmt.Sprint(want[svc].Addrs)}
		if len(want[svc].Addrs) == 0 {
			h.log.Info("no node-port address to serve the health-check node port on (is the Node's address known?)", "service", svc, "port", port)
		}
		addrs := listenAddrs(want[svc].Addrs, port)
		for _, l := range addrs {
			ln, err := listen.Shared(l.network, l.addr)
			if err != nil {
				h.log.Error(err, "cannot serve the health-check node port; load balancers will see this node as down; retrying at the next sync", "service", svc, "address", l.addr)
				continue
			}
			srv := &http.Server{Handler: h.handler(svc), ReadHeaderTimeout: 5 * time.Second}
			s.srvs, s.lns = append(s.srvs, srv), append(s.lns, ln)
			go func() { _ = srv.Serve(ln) }()
		}
		if len(s.srvs) < len(addrs) {
			s.where = "incomplete" // matches no address list: the next Sync opens it again
		}
		h.servers[port] = s
	}
}

func (s *healthServer) close() {
	for _, srv := range s.srvs {
		_ = srv.Close()
	}
	for _, ln := range s.lns {
		_ = ln.Close()
	}
}

type listenAddr struct{ network, addr string }

// listenAddrs is where one health-check port listens: on each address, as
// kube-proxy binds it to the node-port addresses; an unspecified address
// means every address of its family, and both families unspecified make
// one dual-stack socket.
func listenAddrs(addrs []netip.Addr, port uint16) []listenAddr {
	p := strconv.Itoa(int(port))
	any4, any6 := slices.Contains(addrs, netip.IPv4Unspecified()), slices.Contains(addrs, netip.IPv6Unspecified())
	if any4 && any6 {
		return []listenAddr{{"tcp", ":" + p}}
	}
	var out []listenAddr
	for _, a := range addrs {
		switch {
		case a.Is4() && any4 && !a.IsUnspecified(), a.Is6() && any6 && !a.IsUnspecified():
			continue // covered by the family's wildcard
		case a.Is4():
			out = append(out, listenAddr{"tcp4", net.JoinHostPort(a.String(), p)})
		default:
			// tcp6 on [::] is IPv6-only, so it cannot clash with 0.0.0.0.
			out = append(out, listenAddr{"tcp6", net.JoinHostPort(a.String(), p)})
		}
	}
	return out
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
		for _, srv := range s.srvs {
			_ = srv.Shutdown(ctx)
		}
		s.close()
		delete(h.servers, port)
	}
}

func (h *healthServers) String() string {
	return fmt.Sprintf("%d health-check node ports", len(h.servers))
}
