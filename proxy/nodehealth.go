package proxy

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/go-logr/logr"

	"github.com/netplane/netplane/internal/listen"
	"github.com/netplane/netplane/nodeview"
)

// The proxy's node health server is kube-proxy's (its --healthz-bind-address,
// 10256): cloud load balancers ask a node's /healthz before they send it
// traffic of a Service with externalTrafficPolicy Cluster, and take a node
// that is being deleted out of rotation by its answer. /livez answers for the
// proxy alone; /proxyMode (served on the metrics address) names the mode, as
// kube-proxy's does, for tools that ask.

// ProxyMode is what /proxyMode answers: netplane programs nftables.
const ProxyMode = "nftables"

// toBeDeletedTaint is the cluster autoscaler's mark of a node it is about to
// remove; kube-proxy reports such a node as not eligible.
const toBeDeletedTaint = "ToBeDeletedByClusterAutoscaler"

// nodeHealthReport is kube-proxy's JSON body.
type nodeHealthReport struct {
	LastUpdated  string `json:"lastUpdated"`
	CurrentTime  string `json:"currentTime"`
	NodeEligible *bool  `json:"nodeEligible,omitempty"`
}

// nodeHealth decides an answer: /healthz is 200 only when the proxy is
// healthy and the node eligible, /livez when the proxy is healthy.
func nodeHealth(path string, healthy bool, lastUpdated, now time.Time, node *nodeview.Node) (int, nodeHealthReport) {
	r := nodeHealthReport{CurrentTime: now.UTC().Format(time.RFC3339Nano)}
	if !lastUpdated.IsZero() {
		r.LastUpdated = lastUpdated.UTC().Format(time.RFC3339Nano)
	}
	code := http.StatusOK
	if !healthy {
		code = http.StatusServiceUnavailable
	}
	if path == "/livez" {
		return code, r
	}
	eligible := nodeEligible(node)
	r.NodeEligible = &eligible
	if !eligible {
		code = http.StatusServiceUnavailable
	}
	return code, r
}

// nodeEligible is false for a node being deleted or drained by the cluster
// autoscaler; an unknown node (not listed yet) counts as eligible, as in
// kube-proxy.
func nodeEligible(node *nodeview.Node) bool {
	if node == nil {
		return true
	}
	if node.Deleting {
		return false
	}
	for _, t := range node.Taints {
		if t.Key == toBeDeletedTaint {
			return false
		}
	}
	return true
}

// nodeHealthServer is the node health server's view of the proxy.
type nodeHealthServer struct {
	log        logr.Logger
	node       func() *nodeview.Node // this node's Node; nil until listed
	healthy    func() bool
	lastSynced func() time.Time // zero before the first sync
}

// serve serves /healthz and /livez on addr until ctx ends.
func (s nodeHealthServer) serve(ctx context.Context, addr string) error {
	l, err := listen.Shared("tcp", addr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	for _, path := range []string{"/healthz", "/livez"} {
		mux.HandleFunc(path, func(w http.ResponseWriter, _ *http.Request) {
			code, body := nodeHealth(path, s.healthy(), s.lastSynced(), time.Now(), s.node())
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("X-Content-Type-Options", "nosniff")
			w.WriteHeader(code)
			json.NewEncoder(w).Encode(body)
		})
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		srv.Shutdown(shutdown)
	}()
	go srv.Serve(l)
	s.log.Info("serving", "server", "node health (kube-proxy's)", "address", l.Addr().String())
	return nil
}

// proxyModeHandler answers /proxyMode.
func proxyModeHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Write([]byte(ProxyMode))
	})
}
