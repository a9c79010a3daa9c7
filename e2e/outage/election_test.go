package outage

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/netplane/netplane/e2e/framework"
)

// The controller with leader election on (the chart's way) cannot renew
// its Lease while the API server is away: past --leader-elect-renew-deadline
// (10 s) it exits 1, as kube-controller-manager does, and its Deployment
// starts it again. The new process takes the Lease over once the old
// holder's has run out (--leader-elect-lease-duration, 15 s, counted from
// when the new one first reads it), and its slices then catch up.
func TestControllerLosingItsLeaseExitsAndResumesOnceRestarted(t *testing.T) {
	const (
		away          = 20 * time.Second
		leaseDuration = 15 * time.Second
	)
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
	exitErr, exited := p.Wait(away)
	if !exited {
		t.Fatalf("the controller still runs %v into the outage, past its renew deadline", away)
	}
	if exitErr == nil || !strings.Contains(p.Tail(20), "leader election lost") {
		t.Fatalf("the controller exited with %v, want exit 1 saying the leader election was lost:\n%s", exitErr, p.Tail(20))
	}
	t.Logf("the controller exited %v after the API server went away", time.Since(lost).Round(100*time.Millisecond))
	// As its Deployment would, start it again at once.
	if p, err = p.Again(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(away - time.Since(lost)) // the rest of the outage
	back, err := api.RestartAPIServer(time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	deletePod(t, prev.pod)
	m := r.service(t, "elected-again")
	took := r.caughtUp(t, back, m, podIP(prev.pod), leaseDuration+catchUp)
	t.Logf("the restarted controller took the Lease over and caught up %v after the API server was ready", took.Round(10*time.Millisecond))
}
