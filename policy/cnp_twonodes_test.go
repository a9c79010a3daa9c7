package policy

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	netv1 "k8s.io/api/networking/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensions "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	cnpclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned/typed/apis/v1beta1"
	"sigs.k8s.io/yaml"

	"github.com/netplane/netplane/e2e/framework"
)

// ClusterNetworkPolicy through the real node role: the two nodes of
// twonodes_test.go, started before the CRD exists (each says once that it
// enforces NetworkPolicy only), with a NetworkPolicy in force throughout.
// The chart's v0.3.0 CRD is installed while they run: a policy written then
// reaches both nodes' kernels without a restart, and its denials are
// logged with its tier and name. The API server then goes away for 15 s:
// the policy stays in force, one written as soon as the API server answers
// again is in both kernels within catchUp, and each node logs the outage
// once. The CRD removed, the policies' rules leave
// both kernels and the NetworkPolicy stays.

// catchUp bounds, from the API server answering again, a policy written
// then reaching the kernel: the outage gate's 3.5 s (outage.Policy.Bound)
// and a sync.
const catchUp = 6 * time.Second

func TestClusterNetworkPolicyOnTwoNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("needs kube-apiserver; skipped with -short")
	}
	c := newTwoNodes(t)
	c.logSaysOnce(t, "the ClusterNetworkPolicy CRD is not installed")
	c.writePolicy(policy("z", "deny-c", netv1.NetworkPolicySpec{PodSelector: *sel("pod", "c"),
		PolicyTypes: []netv1.PolicyType{netv1.PolicyTypeIngress}}))
	npDenied := []tprobe{{"x/a", "z/c", false, tcp, 80}, {"y/b", "z/c", false, udp, 81}}
	c.waitFor(t, "the NetworkPolicy in force", npDenied, nil)

	start := time.Now()
	installCRD(t, c.API.RestConfig)
	client := cnpclient.NewForConfigOrDie(c.API.RestConfig).ClusterNetworkPolicies()
	p := to(from(admin("deny-y", 10, inNamespace("x")), actDeny, cnpPeers(nsPeerOf("y"))),
		actDeny, cnpPeers(networks(extIP+"/32")))
	if _, err := client.Create(c.Ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.waitForChains(t, "the policy written once the CRD was established", 1, time.Now(), 3*syncPeriod)
	t.Logf("from the CRD's creation: %v", time.Since(start).Round(10*time.Millisecond))
	c.logSaysOnce(t, "the ClusterNetworkPolicy CRD is served")
	denied := []tprobe{{"y/a", "x/a", false, tcp, 80}, {"y/b", "x/c", false, udp, 81}, {"x/b", "ext", false, tcp, 80}}
	allowed := []tprobe{{"z/a", "x/a", false, tcp, 80}, {"y/a", "z/b", false, tcp, 81}, {"x/a", "y/b", false, tcp, 80}}
	c.waitFor(t, "the policy in force", append(denied, npDenied...), allowed)
	framework.Eventually(t, 10*time.Second, "a denial logged with the policy's tier and name", func() error {
		for _, n := range c.Nodes {
			if strings.Contains(nodeLog(n), `tier="Admin" clusterNetworkPolicy="deny-y"`) {
				return nil
			}
		}
		c.connect(denied[0])
		return fmt.Errorf("no log line names the policy")
	})

	back := c.outage(t, 15*time.Second, append(denied, npDenied...), allowed)
	p2 := from(admin("deny-z", 20, inNamespace("y")), actDeny, cnpPeers(nsPeerOf("z")))
	if _, err := client.Create(c.Ctx, p2, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.waitForChains(t, "a policy written as the API server came back", 2, back, catchUp)
	// Logged once the node's last informer is back, which the catch-up
	// above need not wait for (docs/apiserver-outage.md: once 45 s later).
	c.logSaysOnce(t, `"API server outage over"`, time.Minute)
	c.waitFor(t, "the policies in force after the outage", append(denied, npDenied...), allowed)

	crds := apiextensions.NewForConfigOrDie(c.API.RestConfig).ApiextensionsV1().CustomResourceDefinitions()
	if err := crds.Delete(c.Ctx, crdName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c.waitForChains(t, "the CRD deleted", 0, time.Now(), 3*syncPeriod)
	c.logSaysOnce(t, "the ClusterNetworkPolicy CRD is no longer served")
	c.waitFor(t, "NetworkPolicy alone in force", npDenied, append(denied, allowed...))
}

// outage takes the API server away for away, checks that the probes give
// what they gave meanwhile, and returns when it answers /readyz again.
func (c *twoNodes) outage(t *testing.T, away time.Duration, denied, allowed []tprobe) time.Time {
	t.Helper()
	c.API.KillAPIServer()
	lost := time.Now()
	c.waitFor(t, "the policies in force with the API server away", denied, allowed)
	time.Sleep(away - time.Since(lost)) // the outage itself, not a wait for a condition
	back, err := c.API.RestartAPIServer(time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return back
}

// waitForChains waits until each node's table has the chains of want
// ClusterNetworkPolicies (each denies ingress here, so one
// deny-ingress-<hash> chain), and fails unless that held within limit of
// start.
func (c *twoNodes) waitForChains(t *testing.T, what string, want int, start time.Time, limit time.Duration) {
	t.Helper()
	framework.Eventually(t, time.Minute, what, func() error {
		for _, n := range c.Nodes {
			table := n.NS.MustExec(t, "nft", "list", "table", "inet", TableName)
			if got := strings.Count(table, "chain deny-ingress-"); got != want {
				return fmt.Errorf("%s: chains of %d policies, want %d", n.Name, got, want)
			}
			if admin := strings.Contains(table, "chain admin-"); admin != (want > 0) {
				return fmt.Errorf("%s: Admin tier chains: %v", n.Name, admin)
			}
		}
		return nil
	})
	took := time.Since(start)
	if took > limit {
		t.Errorf("%s: %v, want within %v", what, took.Round(10*time.Millisecond), limit)
	}
	t.Logf("%s: both kernels right %v after", what, took.Round(10*time.Millisecond))
}

// logSaysOnce waits until each node logged line once, and no more, up to
// 10 s or the wait given.
func (c *twoNodes) logSaysOnce(t *testing.T, line string, wait ...time.Duration) {
	t.Helper()
	limit := 10 * time.Second
	if len(wait) > 0 {
		limit = wait[0]
	}
	for _, n := range c.Nodes {
		framework.Eventually(t, limit, n.Name+" saying "+line, func() error {
			if got := strings.Count(nodeLog(n), line); got != 1 {
				return fmt.Errorf("%d lines saying %q", got, line)
			}
			return nil
		})
	}
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
	framework.Eventually(t, 30*time.Second, "the CRD established", func() error {
		got, err := c.Get(t.Context(), crd.Name, metav1.GetOptions{})
		if err != nil || !crdServes(got) {
			return fmt.Errorf("not served yet (%v)", err)
		}
		return nil
	})
}
