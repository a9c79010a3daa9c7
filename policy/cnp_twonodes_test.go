package policy

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensions "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	cnpclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned/typed/apis/v1beta1"
	"sigs.k8s.io/yaml"

	"github.com/netplane/netplane/e2e/framework"
)

// ClusterNetworkPolicy through the real node role: the two nodes of
// twonodes_test.go, started before the CRD exists (each says once that it
// enforces NetworkPolicy only), then the chart's v0.3.0 CRD installed and
// the nodes restarted: a policy written to the API server reaches both
// nodes' kernels, its denials are logged with its tier and name, and its
// deletion opens the way again.

func TestClusterNetworkPolicyOnTwoNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("needs kube-apiserver; skipped with -short")
	}
	c := newTwoNodes(t)
	const absent = "the ClusterNetworkPolicy CRD is not installed"
	for _, n := range c.Nodes {
		framework.Eventually(t, 10*time.Second, n.Name+" saying the CRD is absent", func() error {
			if got := strings.Count(nodeLog(n), absent); got != 1 {
				return fmt.Errorf("%d lines saying %q", got, absent)
			}
			return nil
		})
	}
	installCRD(t, c.API.RestConfig)
	for _, n := range c.Nodes {
		c.restart(n, nil)
	}
	client := cnpclient.NewForConfigOrDie(c.API.RestConfig).ClusterNetworkPolicies()
	p := to(from(admin("deny-y", 10, inNamespace("x")), actDeny, cnpPeers(nsPeerOf("y"))),
		actDeny, cnpPeers(networks(extIP+"/32")))
	if _, err := client.Create(c.Ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	denied := []tprobe{{"y/a", "x/a", false, tcp, 80}, {"y/b", "x/c", false, udp, 81}, {"x/b", "ext", false, tcp, 80}}
	allowed := []tprobe{{"z/a", "x/a", false, tcp, 80}, {"y/a", "z/b", false, tcp, 81}, {"x/a", "y/b", false, tcp, 80}}
	c.waitFor(t, "the policy in force", denied, allowed)
	for _, n := range c.Nodes {
		if strings.Count(nodeLog(n), absent) > 1 {
			t.Errorf("%s says the CRD is absent after its restart", n.Name)
		}
	}
	framework.Eventually(t, 10*time.Second, "a denial logged with the policy's tier and name", func() error {
		for _, n := range c.Nodes {
			if strings.Contains(nodeLog(n), `tier="Admin" clusterNetworkPolicy="deny-y"`) {
				return nil
			}
		}
		c.connect(denied[0])
		return fmt.Errorf("no log line names the policy")
	})
	if err := client.Delete(c.Ctx, p.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c.waitFor(t, "the policy gone", nil, append(denied, allowed...))
}

// waitFor waits until every probe of denied is denied and every probe of
// allowed gets through, all in one round.
func (c *twoNodes) waitFor(t *testing.T, what string, denied, allowed []tprobe) {
	t.Helper()
	probes := append(append([]tprobe{}, denied...), allowed...)
	framework.Eventually(t, 3*syncPeriod, what, func() error {
		got := c.make(probes)
		var bad []string
		for i, p := range probes {
			if want := i >= len(denied); got[i] != want {
				bad = append(bad, fmt.Sprintf("%s got through=%v", p, got[i]))
			}
		}
		if len(bad) > 0 {
			return fmt.Errorf("%s", strings.Join(bad, "; "))
		}
		return nil
	})
}

func nodeLog(n *tnode) string {
	b, _ := os.ReadFile(n.Proc.Log)
	return string(b)
}

// installCRD creates the chart's standard-channel CRD and waits until the
// API server serves it.
func installCRD(t *testing.T, cfg *rest.Config) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(framework.RepoRoot(), "charts", "netplane", "files", "clusternetworkpolicies-standard.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.Unmarshal(raw, &crd); err != nil {
		t.Fatal(err)
	}
	c := apiextensions.NewForConfigOrDie(cfg).ApiextensionsV1().CustomResourceDefinitions()
	if _, err := c.Create(t.Context(), &crd, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	disco := kubernetes.NewForConfigOrDie(cfg).Discovery()
	framework.Eventually(t, 30*time.Second, "the CRD served", func() error {
		if served, err := clusterServed(disco); !served {
			return fmt.Errorf("not served yet (%v)", err)
		}
		return nil
	})
}
