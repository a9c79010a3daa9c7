package main

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// stalledWriter returns from each Write some time after the bytes went
// out: the writing thread descheduled right after its syscall, as on a
// machine with many more runnable threads than cores.
type stalledWriter struct {
	net.Conn
	stall time.Duration
}

func (c stalledWriter) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	time.Sleep(c.stall) // the stall itself, not a wait for anything
	return n, err
}

func TestHeld(t *testing.T) {
	for _, tc := range []struct {
		name string
		// answer answers the nth request (from 1) and says whether the
		// load may stop.
		answer    func(n int64, w http.ResponseWriter) (stop bool)
		stall     time.Duration
		wantKept  bool
		wantDials int64
		wantEnded string // in the first Ended and the Error
	}{
		{
			name: "writes return after their answers were read",
			answer: func(n int64, w http.ResponseWriter) bool {
				w.Write([]byte("ok\n"))
				return n == 5
			},
			stall: 100 * time.Millisecond, wantKept: true, wantDials: 1,
		},
		{
			name: "the server closes the connection",
			answer: func(n int64, w http.ResponseWriter) bool {
				if n == 2 {
					w.Header().Set("Connection", "close")
				}
				w.Write([]byte("ok\n"))
				return n == 3
			},
			wantDials: 2, wantEnded: "the server closes the connection",
		},
		{
			name: "the server resets the connection",
			answer: func(n int64, w http.ResponseWriter) bool {
				if n == 2 {
					conn, _, err := http.NewResponseController(w).Hijack()
					if err != nil {
						panic(err)
					}
					conn.(*net.TCPConn).SetLinger(0)
					conn.Close()
					return false
				}
				w.Write([]byte("ok\n"))
				return n == 3
			},
			wantDials: 2, wantEnded: "connection reset by peer",
		},
		{
			name: "an answer is not 200",
			answer: func(n int64, w http.ResponseWriter) bool {
				if n == 2 {
					w.WriteHeader(http.StatusServiceUnavailable)
				}
				return n == 3
			},
			wantDials: 2, wantEnded: "503",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var requests atomic.Int64
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tc.answer(requests.Add(1), w) {
					cancel()
				}
			}))
			defer srv.Close()
			var d net.Dialer
			h := held{url: srv.URL + "/", interval: time.Millisecond, timeout: 5 * time.Second,
				dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
					c, err := d.DialContext(ctx, network, addr)
					if err != nil {
						return nil, err
					}
					return stalledWriter{Conn: c, stall: tc.stall}, nil
				}}
			answered := 0
			r := h.run(ctx, func() { answered++ })
			if context.Cause(ctx) != context.Canceled {
				t.Fatalf("the server did not see its last request: %v", ctx.Err())
			}
			if answered != 1 || r.Kept != tc.wantKept || r.Dials < tc.wantDials || (tc.wantKept && r.Dials != 1) {
				t.Errorf("answered %d times, kept %v after %d dials, want once, %v after %d: %+v", answered, r.Kept, r.Dials, tc.wantKept, tc.wantDials, r)
			}
			if tc.wantEnded == "" && (len(r.Ended) > 0 || r.Error != "") {
				t.Errorf("connections ended: %v, error %q", r.Ended, r.Error)
			}
			if tc.wantEnded != "" && (len(r.Ended) == 0 || !strings.Contains(r.Ended[0], tc.wantEnded) || !strings.Contains(r.Error, tc.wantEnded)) {
				t.Errorf("connections ended %v, error %q, want the first to say %q", r.Ended, r.Error, tc.wantEnded)
			}
		})
	}
}
