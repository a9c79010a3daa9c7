// Package outage is how one process lives through its API server going
// away. client-go's reflectors each retry on their own, backing off from
// 0.8 s to a random 30–60 s, so after a long outage a process's informers
// come back one by one over the next minute, and every informer of every
// node keeps knocking meanwhile. Here the first informer to meet the outage
// closes the process's Gate; the others wait at it without a request; one
// cheap readiness probe (GET /readyz) asks the API server, backing off only
// to ProbeMax; and once it answers, the waiting informers relist spread
// over Spread. Policy is the pure part: the delays, and which errors mean
// the API server is away.
package outage

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilnet "k8s.io/apimachinery/pkg/util/net"
)

// Policy is when a process probes the API server during an outage and how
// it spreads its informers' return.
type Policy struct {
	// ProbeFirst is the wait before an outage's first probe; each failed
	// probe doubles it up to ProbeMax. Every wait is jittered to 75–125 %
	// so the nodes of a cluster, which all lose the API server at once, do
	// not probe in step.
	ProbeFirst, ProbeMax time.Duration
	// ProbeTimeout bounds one probe.
	ProbeTimeout time.Duration
	// Spread is the window over which the waiting informers relist once a
	// probe succeeded, each at a uniformly random moment.
	Spread time.Duration
}

// DefaultPolicy catches up within 3.5 s of the API server being ready
// (Policy.Bound) and asks it once per 1.5–2.5 s per process while it is
// away; docs/apiserver-outage.md compares that with client-go's own.
var DefaultPolicy = Policy{ProbeFirst: 250 * time.Millisecond, ProbeMax: 2 * time.Second, ProbeTimeout: time.Second, Spread: time.Second}

// ProbeDelay is the wait before probe n (from 0) of an outage, for u drawn
// uniformly from [0, 1).
func (p Policy) ProbeDelay(n int, u float64) time.Duration {
	d := p.ProbeFirst
	for i := 0; i < n && d < p.ProbeMax; i++ {
		d *= 2
	}
	d = min(d, p.ProbeMax)
	return time.Duration(float64(d) * (0.75 + 0.5*u))
}

// ReleaseDelay is how long an informer waits, once the probe succeeded,
// before it relists, for u drawn uniformly from [0, 1).
func (p Policy) ReleaseDelay(u float64) time.Duration {
	return time.Duration(float64(p.Spread) * u)
}

// Bound is the longest from the API server answering its readiness probe
// again to the last informer's relist being sent: a whole probe wait (the
// previous probe failed just before) and the whole spread.
func (p Policy) Bound() time.Duration { return p.ProbeMax*5/4 + p.Spread }

// Unavailable reports whether err says the API server (or its etcd) is
// away, rather than that the request was wrong: the connection refused,
// reset, cut or timed out, a 5xx, or a 429 (it sheds load, or its watch
// cache is not initialised yet). A context ended by the caller is not.
func Unavailable(err error) bool {
	switch {
	case err == nil, errors.Is(err, context.Canceled):
		return false
	case errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH),
		errors.Is(err, syscall.EPIPE),
		utilnet.IsProbableEOF(err), utilnet.IsConnectionReset(err):
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		code := st.Status().Code
		return code >= 500 || code == 429
	}
	var oe *net.OpError
	return errors.As(err, &oe) // a dial or read that failed below HTTP
}
