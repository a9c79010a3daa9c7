package scenario

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netplane/netplane/e2e/lab"
)

// explanation is what the scenario reads of `netplane explain -o json`.
type explanation struct {
	Verdict  string `json:"verdict"`
	Reason   string `json:"reason"`
	Backends []struct {
		Pod      string `json:"pod"`
		Verdict  string `json:"verdict"`
		Policies []struct {
			Namespace, Name, Direction, Effect string
			Rule                               int
		} `json:"policies"`
	} `json:"backends"`
	Kernel *struct {
		Node        string   `json:"node"`
		Agrees      bool     `json:"agrees"`
		Differences []string `json:"differences"`
	} `json:"kernel"`
}

// explainFrom runs `netplane explain` for a pod of policyNS to nginx by
// name in the node agent's pod on the client's node, as the chart's README
// tells a user to.
func explainFrom(ctx context.Context, l *lab.Lab, client string) (*explanation, error) {
	p, err := l.Client.CoreV1().Pods(policyNS).Get(ctx, client, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	agent, err := l.AgentPod(ctx, p.Spec.NodeName)
	if err != nil {
		return nil, err
	}
	out, err := l.Exec(ctx, lab.ReleaseNamespace, agent, "netplane", "explain", "--control-plane-endpoint="+l.Config.APIServerURL(),
		"--from="+policyNS+"/"+client, "--to=nginx", "--port=8080/tcp", "-o", "json")
	if err != nil {
		return nil, err
	}
	var x explanation
	if err := json.Unmarshal([]byte(out), &x); err != nil {
		return nil, fmt.Errorf("%v: %s", err, out)
	}
	return &x, nil
}

// explainPolicy: explain names the policy that blocks client-other and
// the rule that admits client-access, and each node's kernel agrees.
func explainPolicy(ctx context.Context, l *lab.Lab, logf func(string, ...any)) error {
	for _, c := range []struct {
		client, verdict, effect string
	}{{"client-other", "Denied", "Isolates"}, {"client-access", "Allowed", "Allows"}} {
		x, err := explainFrom(ctx, l, c.client)
		if err != nil {
			return fmt.Errorf("netplane explain for %s: %w", c.client, err)
		}
		named := false
		for _, b := range x.Backends {
			for _, p := range b.Policies {
				named = named || p.Namespace == policyNS && p.Name == "access-nginx" && p.Effect == c.effect && (c.effect != "Allows" || p.Rule == 1)
			}
		}
		switch {
		case x.Verdict != c.verdict || !named || !strings.Contains(x.Reason, policyNS+"/access-nginx"):
			return fmt.Errorf("netplane explain for %s: %s, not %s naming %s/access-nginx", c.client, x.Reason, c.verdict, policyNS)
		case x.Kernel == nil || !x.Kernel.Agrees:
			return fmt.Errorf("netplane explain for %s: the node's kernel does not agree: %+v", c.client, x.Kernel)
		}
		logf("netplane explain, %s (node %s, kernel agrees): %s", c.client, x.Kernel.Node, x.Reason)
	}
	return nil
}
