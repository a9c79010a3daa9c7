package outage

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/netplane/netplane/e2e/framework"
)

// The controller with leader election on (the chart's way) cannot renew
// its Lease while the API server is away: past --leader-elect-renew-deadline
// (10 s) its controllers stop, so it never writes without the Lease, but the
// process lives on and campaigns again. The Lease still names it, so once
// the API server is back it renews at once (a restarted process would wait
// out the old holder's 15 s) and its slices catch up as the other roles'.
func TestControllerLosingItsLeaseStopsWritingAndResumesWithoutRestart(t *testing.T) {
	const away = 20 * time.Second
	bin := framework.NetplaneBinaries(t)
	ensureNamespace(t)
	dir := t.TempDir()
	args := append([]string{"--role=controller", "--kubeconfig=" + api.Kubeconfig}, roleArgs(dir)...)
	cmd := exec.Command(filepath.Join(bin, "netplane"), append(args, "--leader-elect=true", "--leader-elect-resource-namespace="+ns)...)
	p, err := framework.StartProcess("netplane-controller", cmd, filepath.Join(dir, "netplane.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop(5 * time.Second) })
	r := &roles{node: makeNode(t, "outage-elected")}
	r.add(t, p, nil, false)
	prev := r.service(t, "elected")
	r.caughtUp(t, time.Now(), prev, "", time.Minute)

	api.KillAPIServer()
	lost := time.Now()
	framework.Eventually(t, away, "the controller to stop its controllers on losing the Lease", func() error {
		return logged(p, "leader election lost", 1)
	})
	t.Logf("the controller lost its Lease %v after the API server went away", time.Since(lost).Round(100*time.Millisecond))
	if err, exited := p.Wait(away - time.Since(lost)); exited { // the rest of the outage
		t.Fatalf("the controller exited (%v) on losing its Lease:\n%s", err, p.Tail(20))
	}
	back, err := api.RestartAPIServer(time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	deletePod(t, prev.pod)
	m := r.service(t, "elected-again")
	took := r.caughtUp(t, back, m, podIP(prev.pod), catchUp)
	if err := logged(p, "leader election won", 2); err != nil {
		t.Error(err)
	}
	t.Logf("the controller won its Lease back and caught up %v after the API server was ready", took.Round(10*time.Millisecond))
}

// logged checks p logged line n times.
func logged(p *framework.Process, line string, n int) error {
	data, err := os.ReadFile(p.Log)
	if err != nil {
		return err
	}
	if got := strings.Count(string(data), `"`+line); got != n {
		return fmt.Errorf("%q logged %d times, want %d", line, got, n)
	}
	return nil
}
