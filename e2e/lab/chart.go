package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netplane/netplane/e2e/framework"
)

// The chart's release in the lab, and its workloads.
const (
	Release            = "netplane"
	ReleaseNamespace   = "kube-system"
	NodeDaemonSet      = "netplane-node"
	ControllerWorkload = "netplane-controller"
)

// ChartDir is the chart in the working tree.
func ChartDir() string { return filepath.Join(framework.RepoRoot(), "charts", "netplane") }

// NetplaneImage is the product image (`make image`) as the chart names it
// by default: netplane/netplane tagged with the chart's appVersion.
func NetplaneImage() (string, error) {
	data, err := os.ReadFile(filepath.Join(ChartDir(), "Chart.yaml"))
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "appVersion:"); ok {
			return "netplane/netplane:" + strings.Trim(strings.TrimSpace(v), `"`), nil
		}
	}
	return "", fmt.Errorf("%s/Chart.yaml has no appVersion", ChartDir())
}

// RelayDeployment is the chart's Deployment of pod relays.
const RelayDeployment = "netplane-relay"

// labValues are the chart values where the lab differs from a cluster: the
// image is loaded into each node's containerd, not pulled; the node agent
// reaches the API server at its address, not through the kubernetes
// Service it programs itself; and the lab's CIDRs. Everything else is the
// chart's default.
func labValues(c Config, image string) map[string]any {
	repo, tag, _ := strings.Cut(image, ":")
	values := map[string]any{
		"image": map[string]any{"repository": repo, "tag": tag, "pullPolicy": "Never"},
		"node": map[string]any{
			"controlPlaneEndpoint": c.APIServerURL(),
			"config": map[string]any{
				"clusterCIDRs": strings.Split(c.ClusterCIDRs(), ","),
				"serviceCIDRs": strings.Split(c.ServiceCIDRs(), ","),
			},
		},
		"dns": map[string]any{"service": map[string]any{"clusterIP": c.DNSServiceIP()}},
	}
	if c.PodRelay {
		// One relay a node (host ports), on two nodes: an agent moves to
		// the other when its own goes.
		values["relay"] = map[string]any{"enabled": true, "replicas": min(c.Nodes, 2)}
	}
	return values
}

// valuesPath is the lab's values file, as the last install or upgrade
// left it, so that another process (the lab CLI) upgrades from there.
func (l *Lab) valuesPath() string { return l.path("netplane-values.json") }

// Helm runs the helm command (make tools builds it) against the lab, with
// its caches in the state directory.
func (l *Lab) Helm(ctx context.Context, args ...string) (string, error) {
	helm := framework.Binary("helm")
	if helm == "" {
		return "", fmt.Errorf("helm not found in %s: run `make tools`", framework.BinDir())
	}
	cmd := exec.CommandContext(ctx, helm, append(args, "--kubeconfig="+l.Kubeconfig)...)
	home := l.path("helm")
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home+"/cache", "HELM_CONFIG_HOME="+home+"/config", "HELM_DATA_HOME="+home+"/data")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("helm %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// installNetplane installs the chart as its README tells a user, with the
// lab's values.
func (l *Lab) installNetplane(ctx context.Context) error {
	image, err := NetplaneImage()
	if err != nil {
		return err
	}
	if err := writeValues(l.valuesPath(), labValues(l.Config, image)); err != nil {
		return err
	}
	_, err = l.Helm(ctx, "install", Release, ChartDir(), "--namespace="+ReleaseNamespace, "--values="+l.valuesPath())
	return err
}

// UpgradeNetplane runs `helm upgrade` with the lab's values merged with
// overrides (nested maps, as a values file has them), and waits until
// every netplane pod runs the new revision and is ready.
func (l *Lab) UpgradeNetplane(ctx context.Context, overrides map[string]any) error {
	values := map[string]any{}
	data, err := os.ReadFile(l.valuesPath())
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, &values); err != nil {
		return err
	}
	merge(values, overrides)
	if err := writeValues(l.valuesPath(), values); err != nil {
		return err
	}
	if _, err := l.Helm(ctx, "upgrade", Release, ChartDir(), "--namespace="+ReleaseNamespace, "--values="+l.valuesPath()); err != nil {
		return err
	}
	return l.WaitRolledOut(ctx, 5*time.Minute)
}

// WaitRolledOut waits until the node DaemonSet and the controller and DNS
// Deployments have every pod on their current template, ready.
func (l *Lab) WaitRolledOut(ctx context.Context, timeout time.Duration) error {
	return l.waitFor(timeout, "netplane's pods rolled out", func(ctx context.Context) error {
		ds, err := l.Client.AppsV1().DaemonSets(ReleaseNamespace).Get(ctx, NodeDaemonSet, metav1.GetOptions{})
		if err != nil {
			return err
		}
		s := ds.Status
		if s.ObservedGeneration < ds.Generation || s.UpdatedNumberScheduled != s.DesiredNumberScheduled || s.NumberAvailable != s.DesiredNumberScheduled || s.NumberUnavailable != 0 {
			return fmt.Errorf("DaemonSet %s: %d of %d updated, %d available", ds.Name, s.UpdatedNumberScheduled, s.DesiredNumberScheduled, s.NumberAvailable)
		}
		names := []string{ControllerWorkload, DNSDeployment}
		if l.PodRelay {
			names = append(names, RelayDeployment)
		}
		for _, name := range names {
			if err := l.deploymentRolledOut(ctx, name); err != nil {
				return err
			}
		}
		return nil
	})
}

// WaitDeployment waits until every pod of a kube-system Deployment is on
// its current template and ready.
func (l *Lab) WaitDeployment(ctx context.Context, name string, timeout time.Duration) error {
	return l.waitFor(timeout, name+" rolled out", func(ctx context.Context) error { return l.deploymentRolledOut(ctx, name) })
}

// deploymentRolledOut is nil when every pod of a kube-system Deployment is
// on its current template and ready.
func (l *Lab) deploymentRolledOut(ctx context.Context, name string) error {
	d, err := l.Client.AppsV1().Deployments(ReleaseNamespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	return rolledOut(d)
}

// OwnsProcesses says whether this is the process that runs the lab (not a
// handle from Attach), which alone can stop and start the lab's processes.
func (l *Lab) OwnsProcesses() bool { return l.cp != nil }

func rolledOut(d *appsv1.Deployment) error {
	s, want := d.Status, int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	if s.ObservedGeneration < d.Generation || s.UpdatedReplicas != want || s.Replicas != want || s.AvailableReplicas != want {
		return fmt.Errorf("deployment %s: %d of %d updated, %d replicas, %d available", d.Name, s.UpdatedReplicas, want, s.Replicas, s.AvailableReplicas)
	}
	return nil
}

// merge sets every leaf of src in dst, keeping dst's other keys.
func merge(dst, src map[string]any) {
	for k, v := range src {
		if sub, ok := v.(map[string]any); ok {
			if d, ok := dst[k].(map[string]any); ok {
				merge(d, sub)
				continue
			}
		}
		dst[k] = v
	}
}

// writeValues writes a values file; JSON is YAML, which helm reads.
func writeValues(path string, values map[string]any) error {
	data, err := json.MarshalIndent(values, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o600)
}

// deployNetwork installs netplane on a cluster whose nodes have no network
// yet, as on a fresh cluster: every node must first report NotReady for
// want of a CNI configuration (what Bootstrap records), and turns Ready
// only once the DaemonSet's pod on it has written one. With Encryption
// wireguard, WaitReady then rolls encryption in (encryption.go).
func (l *Lab) deployNetwork(ctx context.Context) error {
	if l.upstream() {
		return nil
	}
	l.Bootstrap = map[string]string{}
	err := l.waitFor(60*time.Second, "every node registered, waiting for its pod network", func(ctx context.Context) error {
		for _, n := range l.Nodes {
			node, err := l.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			for _, c := range node.Status.Conditions {
				if c.Type != corev1.NodeReady {
					continue
				}
				if c.Status == corev1.ConditionTrue {
					return fmt.Errorf("node %s is Ready before netplane is installed: its CNI folder %s is not empty", n.Name, n.CNIConf)
				}
				l.Bootstrap[n.Name] = c.Reason + ": " + c.Message
			}
			if !strings.Contains(l.Bootstrap[n.Name], "NetworkPluginNotReady") {
				return fmt.Errorf("node %s: %q, want NetworkPluginNotReady", n.Name, l.Bootstrap[n.Name])
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return l.installNetplane(ctx)
}

// rollEncryptionIn turns WireGuard on in a running lab as the chart's
// README tells an operator to: `helm upgrade` to permissive, every node
// gets its key and peers while traffic to nodes without one still flows,
// then to strict. The lab's kernel has no WireGuard module, so the nodes
// run WireGuard in the agent.
func (l *Lab) rollEncryptionIn(ctx context.Context) error {
	if l.Encryption != "wireguard" {
		return nil
	}
	if err := l.WaitReady(ctx, 3*time.Minute); err != nil {
		return err
	}
	for _, permissive := range []bool{true, false} {
		err := l.UpgradeNetplane(ctx, map[string]any{"encryption": map[string]any{
			"mode": "wireguard", "implementation": "userspace", "permissive": permissive}})
		if err != nil {
			return fmt.Errorf("encryption (permissive %v): %w", permissive, err)
		}
	}
	return nil
}

// AgentPod is the name of the node DaemonSet's pod on node.
func (l *Lab) AgentPod(ctx context.Context, node string) (string, error) {
	pods, err := l.Client.CoreV1().Pods(ReleaseNamespace).List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/component=node", FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return "", err
	}
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
			return p.Name, nil
		}
	}
	return "", fmt.Errorf("no running netplane node agent pod on %s", node)
}

// TagImage gives the image from a second name in every node's containerd,
// as a second tag of the same build.
func (l *Lab) TagImage(ctx context.Context, from, to string) error {
	for _, n := range l.Nodes {
		out, err := exec.CommandContext(ctx, "ctr", "-a", n.Socket, "-n", "k8s.io", "images", "tag", "--force",
			"docker.io/"+from, "docker.io/"+to).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s: ctr images tag: %v: %s", n.Name, err, out)
		}
	}
	return nil
}
