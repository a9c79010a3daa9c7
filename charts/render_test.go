// Package charts tests charts/netplane: it renders with the Helm Go SDK,
// passes helm lint, is accepted by a real kube-apiserver, grants each role
// exactly what it needs, and its configuration runs the real binary.
package charts

import (
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/netplane/netplane/e2e/framework"
)

const namespace = "kube-system"

func chartDir() string { return filepath.Join(framework.RepoRoot(), "charts", "netplane") }

// render renders the chart with values over its defaults, as `helm template`
// does, and returns the objects in a stable order.
func render(t testing.TB, values map[string]any) []*unstructured.Unstructured {
	t.Helper()
	objs, err := tryRender(values)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func tryRender(values map[string]any) ([]*unstructured.Unstructured, error) {
	chrt, err := loader.Load(chartDir())
	if err != nil {
		return nil, err
	}
	vals, err := util.ToRenderValues(chrt, values, common.ReleaseOptions{Name: "netplane", Namespace: namespace, IsInstall: true}, nil)
	if err != nil {
		return nil, err
	}
	files, err := engine.Render(chrt, vals)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	var objs []*unstructured.Unstructured
	for _, name := range names {
		if !strings.HasSuffix(name, ".yaml") {
			continue
		}
		o, err := decodeObjects(files[name])
		if err != nil {
			return nil, err
		}
		objs = append(objs, o...)
	}
	return objs, nil
}

// decodeObjects decodes a stream of YAML documents, skipping empty ones.
func decodeObjects(docs string) ([]*unstructured.Unstructured, error) {
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(docs), 4096)
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, err
		}
		if len(m) > 0 {
			objs = append(objs, &unstructured.Unstructured{Object: m})
		}
	}
}

// find returns the rendered object of that kind and name, or fails.
func find(t testing.TB, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	o := findIn(objs, kind, name)
	if o == nil {
		t.Fatalf("no %s %s rendered", kind, name)
	}
	return o
}

func TestChartPassesHelmLintStrict(t *testing.T) {
	lint := action.NewLint()
	lint.Strict = true
	lint.Namespace = namespace
	res := lint.Run([]string{chartDir()}, nil)
	for _, m := range res.Messages {
		t.Logf("lint: %s", m)
	}
	if len(res.Errors) > 0 {
		t.Fatalf("helm lint --strict: %v", errors.Join(res.Errors...))
	}
}

func TestSchemaRejectsWrongValues(t *testing.T) {
	cases := []struct {
		name   string
		values map[string]any
		want   string
	}{
		{"replicas as text", map[string]any{"dns": map[string]any{"replicas": "two"}}, "replicas"},
		{"unknown top-level value", map[string]any{"dsn": map[string]any{}}, "dsn"},
		{"ttl out of range", map[string]any{"dns": map[string]any{"config": map[string]any{"ttl": 99999}}}, "ttl"},
		{"pod records mode", map[string]any{"dns": map[string]any{"config": map[string]any{"podRecords": "all"}}}, "podRecords"},
		{"bridge name too long", map[string]any{"node": map[string]any{"config": map[string]any{"bridge": "a-very-long-bridge-name"}}}, "bridge"},
		{"relative host path", map[string]any{"node": map[string]any{"cniBinDir": "opt/cni/bin"}}, "cniBinDir"},
		{"endpoint without scheme", map[string]any{"node": map[string]any{"controlPlaneEndpoint": "10.0.0.1:6443"}}, "controlPlaneEndpoint"},
		{"pull policy", map[string]any{"image": map[string]any{"pullPolicy": "Sometimes"}}, "pullPolicy"},
		{"encryption mode", map[string]any{"encryption": map[string]any{"mode": "ipsec"}}, "mode"},
		{"relative WireGuard key folder", map[string]any{"encryption": map[string]any{"keyDir": "wireguard"}}, "keyDir"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := tryRender(c.values)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one naming %q", err, c.want)
			}
		})
	}
}

func TestDefaultRenderHasEveryPiece(t *testing.T) {
	objs := render(t, nil)
	dns := find(t, objs, "Service", "kube-dns")
	if ip, _, _ := unstructured.NestedString(dns.Object, "spec", "clusterIP"); ip != "10.96.0.10" {
		t.Errorf("kube-dns clusterIP %q", ip)
	}
	ports, _, _ := unstructured.NestedSlice(dns.Object, "spec", "ports")
	if len(ports) != 3 {
		t.Errorf("kube-dns ports %v, want dns UDP, dns TCP, metrics", ports)
	}
	for _, want := range []struct{ kind, name string }{
		{"Deployment", "netplane-controller"}, {"Deployment", "netplane-dns"}, {"DaemonSet", "netplane-node"},
		{"PodDisruptionBudget", "netplane-dns"}, {"ConfigMap", "netplane-controller"}, {"ConfigMap", "netplane-dns"}, {"ConfigMap", "netplane-node"},
		{"ServiceAccount", "netplane-controller"}, {"ServiceAccount", "netplane-dns"}, {"ServiceAccount", "netplane-node"},
		{"ClusterRole", "netplane-controller"}, {"ClusterRole", "netplane-dns"}, {"ClusterRole", "netplane-node"},
		{"Role", "netplane-controller-leader-election"},
	} {
		find(t, objs, want.kind, want.name)
	}
	ds := find(t, objs, "DaemonSet", "netplane-node")
	if hn, _, _ := unstructured.NestedBool(ds.Object, "spec", "template", "spec", "hostNetwork"); !hn {
		t.Error("node DaemonSet is not hostNetwork")
	}
	if pc, _, _ := unstructured.NestedString(ds.Object, "spec", "template", "spec", "priorityClassName"); pc != "system-node-critical" {
		t.Errorf("node priority class %q", pc)
	}
	caps := containerField(t, ds, "securityContext", "capabilities", "add")
	if strings.Join(caps, ",") != "NET_ADMIN,NET_RAW" {
		t.Errorf("node capabilities %v, want NET_ADMIN,NET_RAW only", caps)
	}
	cs, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
	if priv, found, _ := unstructured.NestedBool(cs[0].(map[string]any), "securityContext", "privileged"); found && priv {
		t.Error("the node agent is privileged; it needs NET_ADMIN, NET_RAW and the host's /proc/sys/net only")
	}
	vols, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "volumes")
	if !strings.Contains(fmt.Sprint(vols), "path:/proc/sys/net") {
		t.Errorf("the node agent does not mount the host's /proc/sys/net: %v", vols)
	}
	dep := find(t, objs, "Deployment", "netplane-dns")
	if l, _, _ := unstructured.NestedString(dep.Object, "spec", "template", "metadata", "labels", "k8s-app"); l != "kube-dns" {
		t.Errorf("DNS pods labelled k8s-app=%q; CoreDNS's are kube-dns, and tools find the cluster DNS pods by it", l)
	}
	if caps := containerField(t, dep, "securityContext", "capabilities", "add"); strings.Join(caps, ",") != "NET_BIND_SERVICE" {
		t.Errorf("dns capabilities %v, want NET_BIND_SERVICE only", caps)
	}
}

func TestDisabledRolesRenderNothing(t *testing.T) {
	objs := render(t, map[string]any{"controller": map[string]any{"enabled": false}, "node": map[string]any{"enabled": false}})
	for _, o := range objs {
		if strings.Contains(o.GetName(), "controller") || strings.Contains(o.GetName(), "node") {
			t.Errorf("rendered %s %s with its role disabled", o.GetKind(), o.GetName())
		}
	}
}

func TestNetworkPolicyAndOverlayValuesReachTheNodeConfiguration(t *testing.T) {
	cases := []struct {
		values    map[string]any
		want      []string // lines of the node's config.yaml
		readsPods bool
	}{
		{nil, []string{"networkPolicy:", "enabled: true", "logDenied: false", "overlay:", "mode: cross-subnet", "vxlanPort: 4789", "vxlanVNI: 1"}, true},
		{map[string]any{"networkPolicy": map[string]any{"enabled": false}, "overlay": map[string]any{"mode": "always", "vxlanPort": 8472, "vxlanVNI": 42}},
			[]string{"enabled: false", "mode: always", "vxlanPort: 8472", "vxlanVNI: 42"}, false},
		// In the file rather than a flag, so `netplane explain` run in the
		// agent's pod reaches the API server the agent reaches.
		{map[string]any{"node": map[string]any{"controlPlaneEndpoint": "https://192.0.2.10:6443"}},
			[]string{"clientConnection:", "controlPlaneEndpoint: https://192.0.2.10:6443"}, true},
		// kube-proxy's metrics port, where upstream's "should check
		// kube-proxy urls" and operators' tools ask for /proxyMode.
		{nil, []string{`metricsBindAddress: "0.0.0.0:10249"`}, true},
	}
	for _, c := range cases {
		objs := render(t, c.values)
		_, rules := nodeConfig(t, objs, c.values, c.want)
		if got := strings.Contains(rules, "networkpolicies"); got != c.readsPods {
			t.Errorf("values %v: the node role reads NetworkPolicies = %v, want %v: %s", c.values, got, c.readsPods, rules)
		}
	}
}

// nodeConfig is the node's config.yaml, checked for the lines want, and
// the node role's ClusterRole rules as text.
func nodeConfig(t *testing.T, objs []*unstructured.Unstructured, values map[string]any, want []string) (conf, rules string) {
	t.Helper()
	conf, _, _ = unstructured.NestedString(find(t, objs, "ConfigMap", "netplane-node").Object, "data", "config.yaml")
	for _, line := range want {
		if !strings.Contains(conf, line) {
			t.Errorf("values %v: the node configuration lacks %q:\n%s", values, line, conf)
		}
	}
	return conf, fmt.Sprint(find(t, objs, "ClusterRole", "netplane-node").Object["rules"])
}

// containerField reads a string list from the first container of a workload.
func containerField(t testing.TB, o *unstructured.Unstructured, path ...string) []string {
	t.Helper()
	cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
	if len(cs) == 0 {
		t.Fatalf("%s has no containers", o.GetName())
	}
	v, _, _ := unstructured.NestedStringSlice(cs[0].(map[string]any), path...)
	return v
}

func findIn(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}
