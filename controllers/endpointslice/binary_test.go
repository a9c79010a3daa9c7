package endpointslice

import (
	"fmt"
	"maps"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/netplane/netplane/e2e/framework"
)

// netplaneProcess is `netplane --role=controller` running as its own
// process, the way a cluster runs it.
type netplaneProcess struct {
	p       *framework.Process
	metrics string // host:port of its /metrics
}

// startNetplane runs bin/netplane (NETPLANE_BIN_DIR) with the controller
// role against s, without leader election, and waits until it serves; extra
// flags are appended. The process is stopped when the test ends.
func startNetplane(t testing.TB, s *framework.APIServer, name string, extra ...string) *netplaneProcess {
	t.Helper()
	bin := framework.RequireBinary(t, "netplane")
	args := append([]string{"--role=controller", "--kubeconfig=" + s.Kubeconfig, "--leader-elect=false",
		"--health-bind-address=127.0.0.1:0", "--metrics-bind-address=127.0.0.1:0"}, extra...)
	p, err := framework.StartProcess(name, exec.Command(bin, args...), filepath.Join(s.Dir, name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			p.Stop(15 * time.Second)
		}
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s log tail:\n%s", name, p.Tail(20))
		}
		stop()
	})
	_, metrics := framework.ServedAddresses(t, p, time.Minute)
	return &netplaneProcess{p: p, metrics: metrics}
}

// counters sums the samples of the metric family name per the value of
// label (e.g. netplane_endpointslice_syncs_total by result).
func (n *netplaneProcess) counters(t testing.TB, name, label string) map[string]float64 {
	t.Helper()
	code, body, err := framework.HTTPGet(http.DefaultClient, "http://"+n.metrics+"/metrics")
	if err != nil || code != http.StatusOK {
		t.Fatalf("scraping %s: %d %v", n.metrics, code, err)
	}
	out := map[string]float64{}
	for _, s := range parseSamples(body, name) {
		out[s.labels[label]] += s.value
	}
	return out
}

// sample is one line of the Prometheus text format.
type sample struct {
	labels map[string]string
	value  float64
}

// parseSamples reads the samples of metric name from Prometheus text; label
// values holding commas or escaped quotes are not expected here.
func parseSamples(text, name string) []sample {
	var out []sample
	for line := range strings.Lines(text) {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), name+"{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			continue
		}
		s := sample{labels: map[string]string{}, value: v}
		for kv := range strings.SplitSeq(labels, ",") {
			if k, v, ok := strings.Cut(kv, "="); ok {
				s.labels[k] = strings.Trim(v, `"`)
			}
		}
		out = append(out, s)
	}
	return out
}

// formatCounts renders counts as "k=v" pairs in key order, for logs.
func formatCounts[V int | float64](m map[string]V) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s=%v", k, m[k]))
	}
	return strings.Join(parts, " ")
}
