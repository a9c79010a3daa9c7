package charts

import (
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/netplane/netplane/e2e/framework"
)

var wireguardValues = map[string]any{"encryption": map[string]any{"mode": "wireguard", "wireguardPort": 51821, "implementation": "userspace"}}

func TestEncryptionValuesReachTheNodeConfigurationAndRBAC(t *testing.T) {
	cases := []struct {
		values  map[string]any
		want    []string // lines of the node's config.yaml
		patches bool     // the node role may patch Nodes, under the policy
	}{
		{nil, []string{"encryption:", "mode: none"}, false},
		{wireguardValues, []string{"mode: wireguard", "wireguardPort: 51821", "implementation: userspace", "permissive: false", "privateKeyFile: /var/lib/netplane/wireguard/private.key"}, true},
		// Turning off in steps: the agents remove their annotation.
		{map[string]any{"encryption": map[string]any{"mode": "none", "permissive": true}}, []string{"mode: none", "permissive: true"}, true},
	}
	for _, c := range cases {
		objs := render(t, c.values)
		conf, rules := nodeConfig(t, objs, c.values, c.want)
		if got := strings.Contains(rules, "patch [nodes]") || strings.Contains(rules, "resources:[nodes] verbs:[patch]"); got != c.patches {
			t.Errorf("values %v: the node role patches Nodes = %v, want %v: %s", c.values, got, c.patches, rules)
		}
		vap := findIn(objs, "ValidatingAdmissionPolicy", "netplane-node-wireguard-annotation")
		if (vap != nil) != c.patches || (findIn(objs, "ValidatingAdmissionPolicyBinding", "netplane-node-wireguard-annotation") != nil) != c.patches {
			t.Errorf("values %v: the admission policy and binding rendered = %v, want %v", c.values, vap != nil, c.patches)
		}
		ds := fmt.Sprint(find(t, objs, "DaemonSet", "netplane-node").Object["spec"])
		if got := strings.Contains(ds, "/var/lib/netplane/wireguard") && strings.Contains(ds, "/dev/net/tun"); got != strings.Contains(conf, "mode: wireguard") {
			t.Errorf("values %v: the key's hostPath and the TUN device mounted = %v", c.values, got)
		}
	}
}

// TestNodeRoleMayChangeOnlyItsKeyAnnotation: with the chart's RBAC and
// admission policy in a real API server, the node role's service account
// may set the key annotation of a Node and nothing else on it.
func TestNodeRoleMayChangeOnlyItsKeyAnnotation(t *testing.T) {
	s := framework.StartAPIServer(t, framework.Options{Admission: true})
	apply(t, s, render(t, wireguardValues), false)
	ctx := framework.Ctx(t)
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"zone": "a"}, Annotations: map[string]string{"other": "x"}}}
	if _, err := s.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(s.RestConfig)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + namespace + ":netplane-node",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"}}
	agent, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	patch := func(c kubernetes.Interface, body string) error {
		_, err := c.CoreV1().Nodes().Patch(ctx, "n1", types.MergePatchType, []byte(body), metav1.PatchOptions{})
		return err
	}
	const key = `{"metadata":{"annotations":{"netplane.io/wireguard-public-key":"%s"}}}`
	// The policy takes effect once the API server's admission has read it.
	tries := 0
	framework.Eventually(t, 30*time.Second, "a label change by the node role refused", func() error {
		tries++ // a new value each time: an unchanged label is no change
		if err := patch(agent, fmt.Sprintf(`{"metadata":{"labels":{"zone":"try%d"}}}`, tries)); !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err) {
			return fmt.Errorf("label patch: %v", err)
		}
		return nil
	})
	for _, c := range []struct {
		what, body string
		ok         bool
	}{
		{"its key annotation", fmt.Sprintf(key, "a2V5"), true},
		{"its key annotation again", fmt.Sprintf(key, "bmV3"), true},
		{"another annotation", `{"metadata":{"annotations":{"other":"y"}}}`, false},
		{"a new annotation beside the key", `{"metadata":{"annotations":{"netplane.io/wireguard-public-key":"eA==","more":"z"}}}`, false},
		{"a removed annotation", `{"metadata":{"annotations":{"other":null}}}`, false},
		{"a label", `{"metadata":{"labels":{"zone":"b"}}}`, false},
		{"the spec", `{"spec":{"unschedulable":true}}`, false},
		{"the pod CIDR", `{"spec":{"podCIDR":"10.244.9.0/24"}}`, false},
	} {
		err := patch(agent, c.body)
		if (err == nil) != c.ok {
			t.Errorf("node role patching %s: %v; want allowed %v", c.what, err, c.ok)
		}
	}
	if err := patch(s.Client, `{"metadata":{"labels":{"zone":"c"}}}`); err != nil {
		t.Errorf("an administrator's label change refused: %v", err)
	}
}
