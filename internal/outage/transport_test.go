package outage

import (
	"context"
	"errors"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
)

// roundTrips answers each request with the next error (nil: 200).
type roundTrips struct {
	errs []error
	sent []string
}

func (r *roundTrips) RoundTrip(req *http.Request) (*http.Response, error) {
	r.sent = append(r.sent, req.URL.Path)
	err := r.errs[0]
	r.errs = r.errs[1:]
	if err != nil {
		return nil, err
	}
	return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody}, nil
}

// A cut connection closes the gate at once: client-go's retries of the
// same GET, and every other informer's request, stop at it unsent; the
// readiness probe alone passes.
func TestTransportClosesTheGateAtTheFirstCutConnection(t *testing.T) {
	clk := &signalClock{now: time.Date(2026, 11, 28, 3, 0, 0, 0, time.UTC), timers: make(chan timer)}
	g := newGate(DefaultPolicy, func(context.Context) error { return errors.New("not yet") }, clk, func() float64 { return 0.5 }, logr.Discard())
	ctx, cancel := context.WithCancel(context.Background())
	next := &roundTrips{errs: []error{syscall.ECONNRESET, nil}}
	cfg := g.Config(ctx, &rest.Config{Host: "https://127.0.0.1:6443"})
	rt := cfg.WrapTransport(next)
	for _, c := range []struct {
		path string
		sent bool
		err  func(error) bool
	}{
		{"/api/v1/services", true, Unavailable},
		{"/api/v1/services", false, IsUnavailable}, // client-go's retry
		{"/api/v1/pods", false, IsUnavailable},
		{"/readyz", true, func(err error) bool { return err == nil }},
	} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://127.0.0.1:6443"+c.path, nil)
		before := len(next.sent)
		_, err := rt.RoundTrip(req)
		if sent := len(next.sent) > before; sent != c.sent || !c.err(err) {
			t.Errorf("GET %s: sent %v, error %v; want sent %v", c.path, sent, err, c.sent)
		}
	}
	cancel()
	clk.next(t, 250*time.Millisecond) // the probe's first wait ends with ctx
}
