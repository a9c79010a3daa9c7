package process

import (
	"net/http"

	"sigs.k8s.io/controller-runtime/pkg/healthz"

	"github.com/netplane/netplane/internal/role"
)

// healthHandler serves /healthz and /readyz from checks with
// controller-runtime's healthz handler: "ok", or a line per check with the
// failing ones marked and named ("[-]dns failed: reason withheld"), and
// the reason itself at /readyz/NAME. The manager's own probe server cannot
// be used for two reasons. Its checks must all be added before it starts,
// and a role adds its own as it runs. And it answers 500 where kube-proxy's
// /healthz and CoreDNS's /ready answer 503 Service Unavailable, which is
// what an operator replacing them has scripts and load-balancer checks
// for (kubelet takes either as a failure); this handler answers 503.
func healthHandler(checks *role.Checks) http.Handler {
	mux := http.NewServeMux()
	for path, set := range map[string]func() map[string]func() error{
		"/healthz": checks.Health,
		"/readyz":  checks.Readiness,
	} {
		h := http.StripPrefix(path, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			hz := &healthz.Handler{Checks: map[string]healthz.Checker{}}
			for name, check := range set() {
				hz.Checks[name] = func(*http.Request) error { return check() }
			}
			hz.ServeHTTP(unavailable{w}, r)
		}))
		mux.Handle(path, h)
		mux.Handle(path+"/", h) // a single check: /readyz/dns
	}
	return mux
}

// unavailable turns the healthz handler's 500 into 503.
type unavailable struct{ http.ResponseWriter }

func (w unavailable) WriteHeader(code int) {
	if code == http.StatusInternalServerError {
		code = http.StatusServiceUnavailable
	}
	w.ResponseWriter.WriteHeader(code)
}
