package explain

import (
	"encoding/json"
	"fmt"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/netplane/netplane/policy"
)

// ClusterNetworkPolicy in explain: listing the policies, compiling them into
// the judge's models, and the words for a tier's deciding rule, which the
// policy engine's trace names (policy.Model.Trace; read in policy.go).

// Policy effects of ClusterNetworkPolicy rules: the rule's action.
const (
	Accepts = "Accepts"
	Denies  = "Denies"
	Passes  = "Passes"
)

// clusterPolicies lists the ClusterNetworkPolicies (all of them: any may
// select the pods of the question); none when their CRD is not served.
func (r *reader) clusterPolicies() error {
	rc := r.c.Discovery().RESTClient()
	if rc == nil {
		return nil // a fake client: no API server to ask
	}
	raw, err := rc.Get().AbsPath("/apis", policy.ClusterPolicyResource.Group, policy.ClusterPolicyResource.Version,
		policy.ClusterPolicyResource.Resource).Do(r.ctx).Raw()
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("listing ClusterNetworkPolicies: %w", err)
	}
	var l cnpv1.ClusterNetworkPolicyList
	if err := json.Unmarshal(raw, &l); err != nil {
		return fmt.Errorf("reading the list of ClusterNetworkPolicies: %w", err)
	}
	for i := range l.Items {
		r.in.ClusterPolicies = append(r.in.ClusterPolicies, &l.Items[i])
	}
	return nil
}

// addCluster compiles the question's ClusterNetworkPolicies and keeps the
// Nodes (for the nodes peer), for every model the judge makes.
func (j *judge) addCluster(cnps []*cnpv1.ClusterNetworkPolicy, nodes []*v1.Node) error {
	for _, c := range cnps {
		p, err := policy.CompileCluster(c)
		if err != nil {
			return fmt.Errorf("%v (the nodes keep its previous version in force, which explain cannot know)", err)
		}
		j.cnps = append(j.cnps, p)
	}
	for _, n := range nodes {
		j.nodes = append(j.nodes, policy.NodeFromAPI(n))
	}
	return nil
}

// decidedBy: "accepted by" or "denied by" the tier's deciding rule.
func decidedBy(v policy.ClusterVerdict) string {
	if v.Action == policy.ActionAccept {
		return "accepted by " + clusterWords(v)
	}
	return "denied by " + clusterWords(v)
}

// clusterWords names the tier, the policy and the rule.
func clusterWords(v policy.ClusterVerdict) string {
	name := ""
	if v.RuleName != "" {
		name = fmt.Sprintf(" %q", v.RuleName)
	}
	return fmt.Sprintf("%s ClusterNetworkPolicy %s (rule %d%s)", v.Tier, v.Policy, v.Rule+1, name)
}

func clusterEffect(v policy.ClusterVerdict, dir string) PolicyEffect {
	eff := map[policy.Action]string{policy.ActionAccept: Accepts, policy.ActionDeny: Denies, policy.ActionPass: Passes}[v.Action]
	return PolicyEffect{Name: v.Policy, Tier: v.Tier.String(), Direction: dir, Effect: eff, Rule: v.Rule + 1}
}
