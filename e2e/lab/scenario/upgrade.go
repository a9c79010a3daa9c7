package scenario

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/netplane/netplane/e2e/lab"
)

// loadResult is what `testimage load` prints.
type loadResult struct {
	Seconds float64 `json:"seconds"`
	Stopped string  `json:"stopped"`
	Targets []struct {
		Kind, Target, FirstError string
		OK, Failed               int64
		LongestGap               time.Duration
		GapEnded                 time.Time
		FailedBy                 map[string]int
		LastError                string
	} `json:"targets"`
	Held []struct {
		Target, Error   string
		Requests, Dials int64
		Kept            bool
		Ended           []string
	} `json:"held"`
}

// UpgradeTally is one load's outcome across a disruption, summed over its
// clients: what the demo prints and docs/upgrade.md records.
type UpgradeTally struct {
	Requests, Failed, Queries, FailedQueries int64
	LongestGap                               time.Duration
	Gaps                                     []string // each target's longest gap over a second, and when it ended
	FailedBy                                 []string // each target's failures by the second they were sent in
	Held, Kept                               int
	Errors                                   []string
}

func (t UpgradeTally) String() string {
	return fmt.Sprintf("%d requests (%d failed), %d DNS queries (%d failed), longest gap %v, %d of %d held connections kept",
		t.Requests, t.Failed, t.Queries, t.FailedQueries, t.LongestGap.Round(time.Millisecond), t.Kept, t.Held)
}

// Lost says whether anything was lost.
func (t UpgradeTally) Lost() bool {
	return t.Failed > 0 || t.FailedQueries > 0 || t.Kept < t.Held
}

// Upgrade: while clients in pods on every node and the external client
// open new connections (the ClusterIP by name, a NodePort) and send DNS
// queries for a cluster name, 10 per second each, and hold long-lived
// connections, `helm upgrade` changes the image tag (a second tag of the
// same image) and a configuration value of every role, so that every
// netplane pod is replaced. Nothing may be lost.
//
// In the upstream stack the same load runs across what a rolling update
// does to the systems netplane replaces: kube-proxy stopped and started on
// one node after the other, each waited for until healthy (a DaemonSet's
// maxUnavailable 1), and CoreDNS's Deployment restarted. What they lose is
// reported, not failed: it is the figure netplane's is compared with.
func Upgrade(ctx context.Context, l *lab.Lab, logf func(string, ...any)) error {
	disrupt := func(ctx context.Context) (string, error) { return upgradeNetplane(ctx, l) }
	upstream := l.Config.Stack == lab.StackUpstream
	if upstream {
		if !l.OwnsProcesses() {
			return Skipped{"kube-proxy is restarted by the process that runs the lab: NETPLANE_LAB_STACK=upstream go test -run 'TestScenarios/11' ./e2e/scenarios"}
		}
		disrupt = func(ctx context.Context) (string, error) { return restartUpstream(ctx, l) }
	}
	tally, what, err := UnderLoad(ctx, l, disrupt)
	if err != nil {
		return err
	}
	logf("%s: %s", what, tally)
	if len(tally.Gaps) > 0 {
		logf("gaps over 1s: %s", strings.Join(tally.Gaps, "; "))
	}
	for _, f := range tally.FailedBy {
		logf("failed, by the second sent: %s", f)
	}
	if tally.Lost() && !upstream {
		return fmt.Errorf("lost across the upgrade: %s; %s", tally, strings.Join(tally.Errors, "; "))
	}
	if tally.Lost() {
		logf("first failures: %s", strings.Join(tally.Errors, "; "))
	}
	return nil
}

// restartUpstream restarts kube-proxy on every node in turn, then rolls
// CoreDNS's Deployment as `kubectl rollout restart` does.
func restartUpstream(ctx context.Context, l *lab.Lab) (string, error) {
	start := time.Now()
	for _, n := range l.Nodes {
		if err := n.RestartKubeProxy(ctx); err != nil {
			return "", err
		}
	}
	patch := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"kubectl.kubernetes.io/restartedAt":%q}}}}}`, time.Now().Format(time.RFC3339Nano))
	if _, err := l.Client.AppsV1().Deployments(lab.DNSNamespace).Patch(ctx, l.DNSDeploymentName(), types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return "", err
	}
	if err := l.WaitDeployment(ctx, l.DNSDeploymentName(), 3*time.Minute); err != nil {
		return "", err
	}
	return fmt.Sprintf("kube-proxy restarted on %d nodes in turn and CoreDNS's 2 pods replaced in %.1fs", len(l.Nodes), time.Since(start).Seconds()), nil
}

// upgradeNetplane upgrades the release to the other of two tags of the
// same image and the other of two client QPS values, and checks that
// every netplane pod was replaced.
func upgradeNetplane(ctx context.Context, l *lab.Lab) (string, error) {
	image, err := lab.NetplaneImage()
	if err != nil {
		return "", err
	}
	repo, base, _ := strings.Cut(image, ":")
	before, err := netplanePods(ctx, l)
	if err != nil {
		return "", err
	}
	tag, qps := base+"-b", 25
	if strings.HasSuffix(before[0].Spec.Containers[0].Image, ":"+tag) {
		tag, qps = base, 20
	}
	if err := l.TagImage(ctx, repo+":"+base, repo+":"+tag); err != nil {
		return "", err
	}
	start := time.Now()
	err = l.UpgradeNetplane(ctx, map[string]any{"image": map[string]any{"tag": tag},
		"config": map[string]any{"clientConnection": map[string]any{"qps": qps}}})
	if err != nil {
		return "", err
	}
	after, err := netplanePods(ctx, l)
	if err != nil {
		return "", err
	}
	old := map[string]bool{}
	for _, p := range before {
		old[string(p.UID)] = true
	}
	for _, p := range after {
		if old[string(p.UID)] || !strings.HasSuffix(p.Spec.Containers[0].Image, ":"+tag) {
			return "", fmt.Errorf("pod %s was not replaced by the upgrade (image %s)", p.Name, p.Spec.Containers[0].Image)
		}
	}
	if err := handedOver(ctx, l, after); err != nil {
		return "", err
	}
	return fmt.Sprintf("helm upgrade to %s replaced all %d netplane pods in %.1fs, each node agent taking its node over from the one it replaced", tag, len(before), time.Since(start).Seconds()), nil
}

// handedOver checks that each new node agent among pods took its node
// over from the agent it replaced (docs/upgrade.md), rather than starting
// after that one had gone.
func handedOver(ctx context.Context, l *lab.Lab, pods []corev1.Pod) error {
	for _, p := range pods {
		if p.Labels["app.kubernetes.io/component"] != "node" {
			continue
		}
		log, err := l.Client.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			return fmt.Errorf("logs of %s: %w", p.Name, err)
		}
		if !strings.Contains(string(log), "took the node over") {
			return fmt.Errorf("node agent %s on %s did not take its node over from the agent it replaced: it started after that one had gone", p.Name, p.Spec.NodeName)
		}
	}
	return nil
}

func netplanePods(ctx context.Context, l *lab.Lab) ([]corev1.Pod, error) {
	pods, err := l.Client.CoreV1().Pods(lab.ReleaseNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=netplane"})
	if err != nil {
		return nil, err
	}
	var out []corev1.Pod
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no netplane pods")
	}
	return out, nil
}

// UnderLoad runs the load of the upgrade scenario around disrupt and sums
// what every client saw. The load starts before disrupt and stops once
// disrupt has returned and the cluster DNS Service has as many ready
// endpoints as its Deployment has replicas again.
func UnderLoad(ctx context.Context, l *lab.Lab, disrupt func(context.Context) (string, error)) (UpgradeTally, string, error) {
	var tally UpgradeTally
	if _, _, err := clusterIPExample(ctx, l); err != nil {
		return tally, "", err
	}
	if err := Apply(ctx, l, "03-nodeport.yaml"); err != nil {
		return tally, "", err
	}
	clusterIP, err := clusterIP(ctx, l, "nginx")
	if err != nil {
		return tally, "", err
	}
	clients, err := loadPods(ctx, l)
	if err != nil {
		return tally, "", err
	}
	run := fmt.Sprintf("load-%d", time.Now().UnixNano())
	stop, started := "/tmp/"+run+".stop", "/tmp/"+run+".started"
	other := nodeIP(l, l.Nodes[len(l.Nodes)-1])
	inPod := []string{"/testimage", "load", "--stop-file=" + stop, "--started-file=" + started,
		"--get=http://nginx:8080/", "--get=http://" + net.JoinHostPort(other, "30080") + "/",
		"--lookup=nginx.default.svc." + lab.ClusterDomain, "--lookup-type=" + addressRecord(l),
		"--hold=http://" + net.JoinHostPort(clusterIP, "8080") + "/"}
	outStop, outStarted := filepath.Join(l.StateDir, run+".stop"), filepath.Join(l.StateDir, run+".started")
	defer os.Remove(outStop)
	defer os.Remove(outStarted)
	outside := []string{"load", "--stop-file=" + outStop, "--started-file=" + outStarted}
	for _, n := range l.Nodes {
		outside = append(outside, "--get=http://"+net.JoinHostPort(nodeIP(l, n), "30080")+"/")
	}
	outside = append(outside, "--hold=http://"+net.JoinHostPort(nodeIP(l, l.Nodes[0]), "30080")+"/")

	lctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	results := make([]string, len(clients)+1)
	errs := make([]error, len(clients)+1)
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Add(1)
		go func() { defer wg.Done(); results[i], errs[i] = l.ExecCRI(lctx, "default", c, inPod...) }()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		out, err := exec.CommandContext(lctx, "nsenter", append([]string{"--net=" + l.External.Path, "--", l.TestProgram()}, outside...)...).Output()
		results[len(clients)], errs[len(clients)] = string(out), err
	}()
	// Every client has had an answer from every target before the
	// disruption begins.
	var derr error
	for _, c := range clients {
		if _, err := l.ExecCRI(ctx, "default", c, "/testimage", "wait-file", started); err != nil && derr == nil {
			derr = fmt.Errorf("the load in %s did not start: %w", c, err)
		}
	}
	if derr == nil {
		derr = within(ctx, 30*time.Second, func() error { _, err := os.Stat(outStarted); return err })
	}
	what := ""
	if derr == nil {
		what, derr = disrupt(ctx)
	}
	if derr == nil {
		derr = dnsSettled(ctx, l)
	}
	// The disruption has ended: only now do the loads stop.
	for _, c := range clients {
		if _, err := l.ExecCRI(ctx, "default", c, "/testimage", "touch", stop); err != nil && derr == nil {
			derr = err
		}
	}
	os.WriteFile(outStop, nil, 0o644)
	wg.Wait()
	if derr != nil {
		return tally, "", derr
	}
	tally, err = tallyOf(results, errs)
	return tally, what, err
}

// loadPods starts a pod of the test image on every node, for the load.
func loadPods(ctx context.Context, l *lab.Lab) ([]string, error) {
	var clients []string
	for _, n := range l.Nodes {
		name := "load-" + n.Name
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, Spec: corev1.PodSpec{
			NodeSelector: map[string]string{"kubernetes.io/hostname": n.Name},
			Containers:   []corev1.Container{{Name: "load", Image: lab.TestImage, Args: []string{"pause"}}}}}
		if err := create(ctx, l, pod); err != nil {
			return nil, err
		}
		if err := running(ctx, l, "default", name); err != nil {
			return nil, err
		}
		clients = append(clients, name)
	}
	return clients, nil
}

// tallyOf sums the clients' reports, each of which must have run across
// the disruption. Each had answers from every target before it began (the
// started file), and its stop file was made only after it ended, so a load
// that stopped by its stop file ran across it. Wall-clock times of the
// load and the test are not compared: the lab's machine may step its clock
// (0.13 s in one 25 s disruption, by the test's own monotonic clock).
func tallyOf(results []string, errs []error) (UpgradeTally, error) {
	var tally UpgradeTally
	for i, out := range results {
		if errs[i] != nil {
			return tally, fmt.Errorf("load %d: %v: %s", i, errs[i], out)
		}
		var r loadResult
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			return tally, fmt.Errorf("load %d: %v: %s", i, err, out)
		}
		if r.Stopped != "stop-file" {
			return tally, fmt.Errorf("load %d stopped (%q) after %.1fs, not by its stop file after the disruption", i, r.Stopped, r.Seconds)
		}
		tally.add(r)
	}
	return tally, nil
}

func (t *UpgradeTally) add(r loadResult) {
	for _, x := range r.Targets {
		if x.Kind == "dns" {
			t.Queries += x.OK + x.Failed
			t.FailedQueries += x.Failed
		} else {
			t.Requests += x.OK + x.Failed
			t.Failed += x.Failed
		}
		t.LongestGap = max(t.LongestGap, x.LongestGap)
		if x.LongestGap > time.Second {
			t.Gaps = append(t.Gaps, fmt.Sprintf("%s %s: %v, ended %s", x.Kind, x.Target, x.LongestGap.Round(time.Millisecond), x.GapEnded.Format("15:04:05.000")))
		}
		if x.FirstError != "" {
			t.Errors = append(t.Errors, x.Target+": "+x.FirstError)
		}
		if len(x.FailedBy) > 0 {
			var by []string
			for _, sec := range slices.Sorted(maps.Keys(x.FailedBy)) {
				by = append(by, fmt.Sprintf("%s %d", sec, x.FailedBy[sec]))
			}
			t.FailedBy = append(t.FailedBy, fmt.Sprintf("%s %s: %s; last: %s", x.Kind, x.Target, strings.Join(by, ", "), x.LastError))
		}
	}
	for _, h := range r.Held {
		t.Held++
		if h.Kept {
			t.Kept++
		} else {
			t.Errors = append(t.Errors, fmt.Sprintf("held %s: dialled %d times, %s (connections ended: %s)", h.Target, h.Dials, h.Error, strings.Join(h.Ended, "; ")))
		}
	}
}

// dnsSettled waits until the cluster DNS Service has a ready endpoint for
// every replica of its Deployment and no other.
func dnsSettled(ctx context.Context, l *lab.Lab) error {
	return within(ctx, 2*time.Minute, func() error {
		d, err := l.Client.AppsV1().Deployments(lab.DNSNamespace).Get(ctx, l.DNSDeploymentName(), metav1.GetOptions{})
		if err != nil {
			return err
		}
		slices, err := l.Client.DiscoveryV1().EndpointSlices(lab.DNSNamespace).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + lab.DNSService})
		if err != nil {
			return err
		}
		ready, all := 0, 0
		for _, s := range slices.Items {
			if s.AddressType != addressType(l) {
				continue
			}
			for _, e := range s.Endpoints {
				all++
				if e.Conditions.Ready == nil || *e.Conditions.Ready {
					ready++
				}
			}
		}
		if want := int(*d.Spec.Replicas); ready != want || all != want {
			return fmt.Errorf("kube-dns has %d endpoints, %d ready, want %d", all, ready, want)
		}
		return nil
	})
}

// EncryptionRollout: under the same load, encryption is rolled into the
// running cluster and out again as the chart's README tells an operator
// to: helm upgrade to WireGuard in permissive mode, then strict (where the
// underlay must carry no pod packet in clear), then back to permissive,
// off while still permissive, and off. Nothing may be lost on the way. A lab encrypted from its start
// (NETPLANE_LAB_ENCRYPTION) skips it: it went the first two steps already.
func EncryptionRollout(ctx context.Context, l *lab.Lab, logf func(string, ...any)) error {
	if l.Config.Stack == lab.StackUpstream {
		return Skipped{"the upstream stack has no encryption"}
	}
	if l.Config.Encryption == "wireguard" {
		return Skipped{"the lab was encrypted at its start by the same two upgrades"}
	}
	disrupt := func(ctx context.Context) (string, error) {
		start := time.Now()
		step := func(mode string, permissive bool) error {
			logf("%s helm upgrade: encryption %s, permissive %v", time.Now().Format("15:04:05.000"), mode, permissive)
			return l.UpgradeNetplane(ctx, map[string]any{"encryption": map[string]any{
				"mode": mode, "implementation": "userspace", "permissive": permissive}})
		}
		if err := step("wireguard", true); err != nil {
			return "", err
		}
		if err := step("wireguard", false); err != nil {
			return "", err
		}
		strict := time.Since(start)
		if err := noClearTraffic(ctx, l, logf); err != nil {
			return "", fmt.Errorf("strict WireGuard: %w", err)
		}
		// Out as the chart's README says: each agent removes its key
		// annotation while it may still patch Nodes (permissive), and only
		// then is that right taken back.
		for _, s := range []struct {
			mode       string
			permissive bool
		}{{"wireguard", true}, {"none", true}, {"none", false}} {
			if err := step(s.mode, s.permissive); err != nil {
				return "", err
			}
		}
		return fmt.Sprintf("encryption rolled in (permissive, strict: %.1fs) and out (permissive, off, off without the right to patch Nodes) in %.1fs", strict.Seconds(), time.Since(start).Seconds()), nil
	}
	tally, what, err := UnderLoad(ctx, l, disrupt)
	if err != nil {
		return err
	}
	logf("%s: %s", what, tally)
	if tally.Lost() {
		return fmt.Errorf("lost across the encryption rollout: %s; %s", tally, strings.Join(tally.Errors, "; "))
	}
	return nil
}
