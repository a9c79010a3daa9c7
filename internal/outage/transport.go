package outage

import (
	"context"
	"errors"
	"net/http"

	"k8s.io/client-go/rest"
)

// Config returns a copy of cfg whose requests pass the gate (transport).
func (g *Gate) Config(ctx context.Context, cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &transport{g: g, ctx: ctx, next: rt} })
	return c
}

// transport sends nothing but the readiness probe while the gate is
// closed, and closes it on a connection that fails. client-go retries a GET
// that met a reset or cut connection up to 10 times, a second apart, before
// its caller hears of it: behind a load balancer, where a dead API server
// looks like that rather than like a refused connection, every informer
// would keep knocking for 10 s. Here the first failure closes the gate and
// the retries end at it.
type transport struct {
	g    *Gate
	ctx  context.Context // the process's life, bounding the probes
	next http.RoundTripper
}

var errGateClosed = errors.New("the API server is away; waiting for its readiness probe")

func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	probe := req.URL.Path == "/readyz"
	if !probe && t.g.closed() {
		return nil, ErrUnavailable(errGateClosed)
	}
	resp, err := t.next.RoundTrip(req)
	if err != nil && !probe && req.Context().Err() == nil && Unavailable(err) {
		t.g.mu.Lock()
		t.g.lose(t.ctx, err)
		t.g.mu.Unlock()
	}
	return resp, err
}
