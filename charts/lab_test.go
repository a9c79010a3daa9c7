package charts

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/lab"
	"github.com/netplane/netplane/e2e/lab/scenario"
	"github.com/netplane/netplane/e2e/netns"
)

// labValues point the chart at the lab: its image, its API server address
// (the node agent must not depend on the kubernetes Service it programs)
// and its cluster and service CIDRs. Nothing else differs from the defaults.
var labValues = map[string]any{
	"image": map[string]any{"repository": strings.Split(lab.NetplaneImage, ":")[0], "tag": strings.Split(lab.NetplaneImage, ":")[1], "pullPolicy": "Never"},
	"node": map[string]any{
		"controlPlaneEndpoint": fmt.Sprintf("https://%s:%d", lab.ControlPlaneIP, lab.APIPort),
		"config": map[string]any{"clusterCIDRs": anySlice(strings.Split(lab.ClusterCIDRs, ",")),
			"serviceCIDRs": anySlice(strings.Split(lab.ServiceCIDRs, ","))},
	},
}

// TestTheChartRunsTheLab runs the lab with netplane as the chart deploys
// it. Everything the chart renders is applied to the lab's API server,
// except the controller's Deployment and the node DaemonSet: the lab runs
// those two roles as processes (the controller beside the control plane, the
// node agent in every node's namespace, where a DaemonSet pod could not keep
// each node's CNI folders apart on one machine), with exactly the arguments,
// environment and config file the chart renders, and as their own
// ServiceAccounts through tokens from the TokenRequest API. The DNS runs as
// the chart's own Deployment: its pods, with the ConfigMap mounted and the
// projected token, run on the lab's nodes behind the chart's kube-dns
// Service. Then scenarios 1 (ClusterIP, names) and 5 (headless DNS) must
// pass, and no role may log an RBAC refusal.
func TestTheChartRunsTheLab(t *testing.T) {
	if testing.Short() {
		t.Skip("the lab is not short")
	}
	if os.Geteuid() != 0 || framework.Binary("kube-apiserver") == "" || framework.Binary("containerd") == "" {
		if os.Getenv(framework.RequiredEnv) == "1" {
			t.Fatal("the lab needs root and `make tools` (kube-apiserver, containerd)")
		}
		t.Skip("the lab needs root and `make tools`")
	}
	netns.RemoveStale()
	objs := render(t, labValues)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	l, err := lab.Start(ctx, lab.Config{Nodes: 2, StateDir: filepath.Join(dir, "lab"), Log: t.Logf,
		Netplane: func(ctx context.Context, l *lab.Lab) (*lab.Roles, error) { return chartRoles(ctx, l, objs, dir) }})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := l.Close(); err != nil {
			t.Errorf("lab teardown: %v", err)
		}
	}()
	if err := l.WaitReady(ctx, 3*time.Minute); err != nil {
		t.Fatalf("%v\n%s", err, nodeLogs(l, 20))
	}
	for _, s := range scenario.All {
		if n := strings.Fields(s.Name)[0]; n != "1" && n != "5" {
			continue
		}
		t.Run(s.Name, func(t *testing.T) {
			sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			defer cancel()
			if err := s.Run(sctx, l, t.Logf); err != nil {
				t.Fatal(err)
			}
		})
	}
	logs := map[string]string{"controller": readFile(filepath.Join(dir, "lab", "logs", "netplane-controller.log"))}
	for _, n := range l.Nodes {
		// netplane's own log: the kubelet's has the Node authorizer's
		// refusals of pods already gone, which are not netplane's.
		logs[n.Name] = readFile(filepath.Join(dir, "lab", "logs", n.Name+"-netplane.log"))
	}
	for who, log := range logs {
		if !strings.Contains(log, "starting") {
			t.Errorf("no log of netplane on %s", who)
		}
		if bad := grepLines(log, "forbidden"); bad != "" {
			t.Errorf("netplane on %s was refused something by RBAC:\n%s", who, bad)
		}
	}
}

// chartRoles applies the rendered objects (but the two workloads the lab
// runs as processes) and turns those workloads into the lab's role
// commands: the container's args and env, the ConfigMap's config.yaml at a
// local path, and a token of the workload's ServiceAccount.
func chartRoles(ctx context.Context, l *lab.Lab, objs []*unstructured.Unstructured, dir string) (*lab.Roles, error) {
	processes := map[string]string{"Deployment/netplane-controller": "controller", "DaemonSet/netplane-node": "node"}
	var rest []*unstructured.Unstructured
	for _, o := range objs {
		if _, ok := processes[o.GetKind()+"/"+o.GetName()]; !ok {
			rest = append(rest, o)
		}
	}
	if err := applyObjects(ctx, l.RestConfig, rest, false); err != nil {
		return nil, err
	}
	roles := &lab.Roles{DNSDeployed: true}
	for _, o := range objs {
		role, ok := processes[o.GetKind()+"/"+o.GetName()]
		if !ok {
			continue
		}
		cmd, err := roleCommand(ctx, l, objs, o, role, dir)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", role, err)
		}
		if role == "controller" {
			roles.Controller = cmd
		} else {
			roles.Node = cmd
		}
	}
	return roles, nil
}

func roleCommand(ctx context.Context, l *lab.Lab, objs []*unstructured.Unstructured, workload *unstructured.Unstructured, role, dir string) (lab.RoleCommand, error) {
	var cmd lab.RoleCommand
	cm := findIn(objs, "ConfigMap", "netplane-"+role)
	if cm == nil {
		return cmd, fmt.Errorf("no ConfigMap netplane-%s rendered", role)
	}
	configYAML, _, _ := unstructured.NestedString(cm.Object, "data", "config.yaml")
	cfgPath := filepath.Join(dir, role+"-config.yaml")
	if err := os.WriteFile(cfgPath, []byte(configYAML), 0o600); err != nil {
		return cmd, err
	}
	containers, _, _ := unstructured.NestedSlice(workload.Object, "spec", "template", "spec", "containers")
	c := containers[0].(map[string]any)
	args, _, _ := unstructured.NestedStringSlice(c, "args")
	for i, a := range args {
		if a == "--config=/etc/netplane/config.yaml" { // the ConfigMap's mount
			args[i] = "--config=" + cfgPath
		}
	}
	cmd.Args = args
	env, _, _ := unstructured.NestedSlice(c, "env")
	for _, e := range env {
		e := e.(map[string]any)
		if v, ok := e["value"].(string); ok {
			cmd.Env = append(cmd.Env, fmt.Sprintf("%s=%s", e["name"], v))
		} // downward-API values (the node name) the lab sets per node
	}
	sa, _, _ := unstructured.NestedString(workload.Object, "spec", "template", "spec", "serviceAccountName")
	tr, err := l.Client.CoreV1().ServiceAccounts(workload.GetNamespace()).CreateToken(ctx, sa,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr(int64(3600))}}, metav1.CreateOptions{})
	if err != nil {
		return cmd, fmt.Errorf("token for ServiceAccount %s: %w", sa, err)
	}
	cmd.Token = tr.Status.Token
	return cmd, nil
}

// anySlice is what a values file decodes to, which the schema check needs.
func anySlice(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

func findIn(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}

func nodeLogs(l *lab.Lab, lines int) string {
	var b strings.Builder
	for _, n := range l.Nodes {
		b.WriteString(n.Logs(lines))
	}
	return b.String()
}

func readFile(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

func grepLines(text, word string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, word) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
