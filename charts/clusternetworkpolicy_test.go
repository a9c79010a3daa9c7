package charts

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/netplane/netplane/e2e/framework"
)

const cnpCRD = "clusternetworkpolicies.policy.networking.k8s.io"

// TestTheClusterNetworkPolicyCRDIsTheOneTheModuleShips: the chart's copies
// are the v0.3.0 module's files byte for byte, so the CRD installed is the
// API's own (the node role's types come from the same module).
func TestTheClusterNetworkPolicyCRDIsTheOneTheModuleShips(t *testing.T) {
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/network-policy-api")
	cmd.Dir = framework.RepoRoot()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("finding the network-policy-api module: %v", err)
	}
	dir := strings.TrimSpace(string(out))
	for _, channel := range []string{"standard", "experimental"} {
		want, err := os.ReadFile(filepath.Join(dir, "config", "crd", channel, "policy.networking.k8s.io_clusternetworkpolicies.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(chartDir(), "files", "clusternetworkpolicies-"+channel+".yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("files/clusternetworkpolicies-%s.yaml differs from the module's %s CRD (%s): copy it again", channel, channel, dir)
		}
	}
}

func TestTheClusterNetworkPolicyCRDFollowsTheChannelValue(t *testing.T) {
	for _, tc := range []struct {
		values    map[string]any
		channel   string // "" for no CRD
		namedPort bool
	}{
		{nil, "standard", false},
		{map[string]any{"clusterNetworkPolicy": map[string]any{"channel": "experimental"}}, "experimental", true},
		{map[string]any{"clusterNetworkPolicy": map[string]any{"installCRD": false}}, "", false},
	} {
		crd := findIn(render(t, tc.values), "CustomResourceDefinition", cnpCRD)
		if tc.channel == "" {
			if crd != nil {
				t.Errorf("values %v: the CRD is rendered", tc.values)
			}
			continue
		}
		if crd == nil {
			t.Fatalf("values %v: no CRD %s", tc.values, cnpCRD)
		}
		ann := crd.GetAnnotations()
		if ann["policy.networking.k8s.io/bundle-version"] != "v0.3.0" || ann["policy.networking.k8s.io/channel"] != tc.channel {
			t.Errorf("values %v: annotations %v, want bundle-version v0.3.0, channel %s", tc.values, ann, tc.channel)
		}
		if ann["helm.sh/resource-policy"] != "keep" {
			t.Errorf("values %v: the CRD (and every policy with it) goes with an uninstall: %v", tc.values, ann)
		}
		if got := strings.Contains(crdText(t, crd), "destinationNamedPort"); got != tc.namedPort {
			t.Errorf("values %v: destinationNamedPort in the schema = %v, want %v", tc.values, got, tc.namedPort)
		}
	}
}

func crdText(t *testing.T, crd *unstructured.Unstructured) string {
	t.Helper()
	b, err := crd.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
