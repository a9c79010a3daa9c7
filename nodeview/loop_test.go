package nodeview

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/internal/role"
)

// TestTheLoopOwnsReadinessLogsAndMetrics: every feature's sync outcome is
// judged in one place. A wait is not a failure (nothing retried, no error
// counted) but not ready; a failure is counted and not ready; each
// outcome is logged once however often it repeats; only a converged sync
// moves the last-sync time, and the first one ends the feature's start
// (role.Started).
func TestTheLoopOwnsReadinessLogsAndMetrics(t *testing.T) {
	boom := errors.New("boom")
	for _, tc := range []struct {
		name       string
		outcomes   []error
		wantReturn error // of the last sync, as the runner sees it
		wantReady  string
		wantErrors float64
		wantSynced bool
		wantLogs   int
	}{
		{"converged", []error{nil, nil}, nil, "", 0, true, 1},
		{"waiting, twice: one line, not ready, no error", []error{Waiting("no Node yet"), Waiting("no Node yet")}, nil, "no Node yet", 0, false, 1},
		{"failed, twice: one line, two errors", []error{boom, boom}, boom, "boom", 2, false, 1},
		{"failed then converged: said again", []error{nil, boom, nil}, nil, "", 1, true, 3},
		{"waiting then converged", []error{Waiting("no Node yet"), nil}, nil, "", 0, true, 2},
		{"failed then waiting", []error{boom, Waiting("no Node yet")}, nil, "no Node yet", 1, false, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			var logs []string
			started := 0
			d := role.Deps{Config: &v1alpha1.Configuration{}, Checks: role.NewChecks(), Metrics: reg,
				Log:     funcr.New(func(_, args string) { logs = append(logs, args) }, funcr.Options{}),
				Started: role.NewStarted(func() { started++ })}
			i := 0
			l, err := NewLoop(d, "podnet", func(context.Context, bool) error { i++; return tc.outcomes[i-1] })
			if err != nil {
				t.Fatal(err)
			}
			if err := l.ready(); err == nil {
				t.Fatal("ready before any sync")
			}
			var got error
			for range tc.outcomes {
				got = l.Sync(context.Background(), false)
			}
			if !errors.Is(got, tc.wantReturn) {
				t.Errorf("sync returned %v to the runner, want %v", got, tc.wantReturn)
			}
			if r := errString(l.ready()); r != tc.wantReady {
				t.Errorf("readiness %q, want %q", r, tc.wantReady)
			}
			if n := testutil.ToFloat64(l.metrics.errors.WithLabelValues("podnet")); n != tc.wantErrors {
				t.Errorf("errors counted %v, want %v", n, tc.wantErrors)
			}
			if synced := testutil.ToFloat64(l.metrics.last.WithLabelValues("podnet")) > 0; synced != tc.wantSynced {
				t.Errorf("last sync set %v, want %v", synced, tc.wantSynced)
			}
			if want := map[bool]int{true: 1}[tc.wantSynced]; started != want {
				t.Errorf("the start ended %d times, want %d", started, want)
			}
			if len(logs) != tc.wantLogs {
				t.Errorf("logged %d lines, want %d: %s", len(logs), tc.wantLogs, strings.Join(logs, "\n"))
			}
		})
	}
}

// TestFeaturesShareOneMetricsFamily: the second feature's loop takes the
// family the first registered instead of failing on the duplicate.
func TestFeaturesShareOneMetricsFamily(t *testing.T) {
	reg := prometheus.NewRegistry()
	d := role.Deps{Config: &v1alpha1.Configuration{}, Checks: role.NewChecks(), Metrics: reg}
	idle := func(context.Context, bool) error { return nil }
	var loops []*Loop
	for _, f := range []string{"overlay", "podnet"} {
		l, err := NewLoop(d, f, idle)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		loops = append(loops, l)
		_ = l.Sync(context.Background(), true)
	}
	if n := testutil.CollectAndCount(reg, "netplane_node_last_sync_timestamp_seconds"); n != 2 {
		t.Errorf("%d last-sync series, want one per feature", n)
	}
	if loops[0].metrics.last != loops[1].metrics.last {
		t.Error("the loops hold two families")
	}
}
