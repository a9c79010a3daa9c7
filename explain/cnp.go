package explain

import (
	"encoding/json"
	"fmt"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/netplane/netplane/policy"
)

// ClusterNetworkPolicy's tiers around NetworkPolicy's reading: which rule
// of the Admin and Baseline tiers decides each direction is the policy
// package's own trace of its compiled policies (policy.Model.TraceCluster),
// on the same model whose table decides; explain adds only the order of
// the tiers, which the table's chains follow.

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

// readTiered judges one direction at the end self: the Admin tier, then
// NetworkPolicy's reading (read) when a NetworkPolicy isolates self, else
// the Baseline tier, else allowed.
func (j *judge) readTiered(self, peer end, proto uint8, port uint16, dir policy.Direction) (bool, string, []PolicyEffect) {
	ok, words, effects := j.read(self, peer, proto, port, dir)
	if self.pod == nil || !enforced(self.pod) || len(j.cnps) == 0 {
		return ok, words, effects
	}
	admin, base := j.model(self.node).TraceCluster(policy.Flow{Dir: dir, Pod: types.NamespacedName{Namespace: self.pod.Namespace, Name: self.pod.Name},
		Peer: peer.ip, Proto: proto, Port: port})
	dirName := DirIngress
	if dir == policy.Egress {
		dirName = DirEgress
	}
	var tiers []PolicyEffect
	decided := func(v policy.ClusterVerdict) (bool, string, []PolicyEffect) {
		verb := "denied by "
		if v.Action == policy.ActionAccept {
			verb = "accepted by "
		}
		return v.Action == policy.ActionAccept, verb + clusterWords(v),
			append(tiers, clusterEffect(v, dirName))
	}
	switch admin.Action {
	case policy.ActionAccept, policy.ActionDeny:
		return decided(admin)
	case policy.ActionPass:
		tiers = append(tiers, clusterEffect(admin, dirName))
		words = "passed by " + clusterWords(admin) + "; " + words
	}
	if len(effects) > 0 { // a NetworkPolicy isolates self: its word is final
		return ok, words, append(tiers, effects...)
	}
	switch base.Action {
	case policy.ActionAccept, policy.ActionDeny:
		ok, w, eff := decided(base)
		if admin.Action == policy.ActionPass {
			w = "passed by " + clusterWords(admin) + "; " + w
		}
		return ok, w, eff
	case policy.ActionPass:
		return true, "passed by " + clusterWords(base) + "; allowed by default", append(tiers, clusterEffect(base, dirName))
	}
	return ok, words, tiers
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
