package outage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func TestProbeDelayDoublesToItsCapJitteredBy25Percent(t *testing.T) {
	p := DefaultPolicy
	for _, c := range []struct {
		n    int
		u    float64
		want time.Duration
	}{
		{0, 0.5, 250 * time.Millisecond},
		{0, 0, 187500 * time.Microsecond},
		{1, 0.5, 500 * time.Millisecond},
		{2, 0.5, time.Second},
		{3, 0.5, 2 * time.Second},
		{4, 0.5, 2 * time.Second},
		{100, 0, 1500 * time.Millisecond},
		{100, 0.999999, 2499999 * time.Microsecond},
	} {
		if got := p.ProbeDelay(c.n, c.u); got != c.want {
			t.Errorf("ProbeDelay(%d, %v) = %v, want %v", c.n, c.u, got, c.want)
		}
	}
}

func TestReleaseDelayIsAShareOfTheSpreadAndBoundAddsTheLongestProbeWait(t *testing.T) {
	p := DefaultPolicy
	for u, want := range map[float64]time.Duration{0: 0, 0.25: 250 * time.Millisecond, 0.9: 900 * time.Millisecond} {
		if got := p.ReleaseDelay(u); got != want {
			t.Errorf("ReleaseDelay(%v) = %v, want %v", u, got, want)
		}
	}
	if got, want := p.Bound(), 3500*time.Millisecond; got != want {
		t.Errorf("Bound() = %v, want %v", got, want)
	}
}

func TestUnavailableIsTheAPIServerAwayNotARequestRefused(t *testing.T) {
	gr := schema.GroupResource{Resource: "services"}
	refused := &url.Error{Op: "Get", URL: "https://10.0.0.1:6443/api/v1/services", Err: &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}}
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"connection refused", refused, true},
		{"connection reset", fmt.Errorf("read: %w", syscall.ECONNRESET), true},
		{"stream cut", io.ErrUnexpectedEOF, true},
		{"request timed out", context.DeadlineExceeded, true},
		{"503", apierrors.NewServiceUnavailable("etcd is away"), true},
		{"500 from etcd", apierrors.NewInternalError(errors.New("etcdserver: request timed out")), true},
		{"504", apierrors.NewTimeoutError("etcd", 1), true},
		{"429 watch cache initialising", apierrors.NewTooManyRequests("storage is (re)initializing", 1), true},
		{"our own stop", context.Canceled, false},
		{"403", apierrors.NewForbidden(gr, "", errors.New("RBAC")), false},
		{"410", apierrors.NewResourceExpired("too old resource version"), false},
		{"404", apierrors.NewNotFound(gr, "x"), false},
		{"bad selector", apierrors.NewBadRequest("unable to parse requirement"), false},
	} {
		if got := Unavailable(c.err); got != c.want {
			t.Errorf("%s: Unavailable(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}

func TestErrUnavailableHidesItsCauseFromReflectorsRetryingRefusedConnections(t *testing.T) {
	err := fmt.Errorf("failed to list *v1.Service: %w", ErrUnavailable(fmt.Errorf("dial: %w", syscall.ECONNREFUSED)))
	if !IsUnavailable(err) {
		t.Errorf("IsUnavailable(%v) = false", err)
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("%v still wraps ECONNREFUSED: a reflector would retry it on its own backoff", err)
	}
}
