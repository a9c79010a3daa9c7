package policy

import (
	"context"
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensions "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	cnpclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned/typed/apis/v1beta1"

	"github.com/netplane/netplane/internal/informer"
	"github.com/netplane/netplane/internal/role"
)

// This file is the feature's ClusterNetworkPolicy part: while the API
// server serves clusternetworkpolicies.policy.networking.k8s.io v1beta1
// (its CRD is installed and established, cnp_crd.go), a reflector of the
// policies writes into the model like the NetworkPolicy views, and a Node
// view (for the nodes peer) does so always. Without the CRD the node
// enforces NetworkPolicy alone and says so once.

// clusterPolicies is the sink kind of ClusterNetworkPolicy records.
const clusterPolicies informer.Kind = "clusternetworkpolicies"

// cnpGroupVersion is the API group version of ClusterNetworkPolicy.
var cnpGroupVersion = schema.GroupVersion(cnpv1.GroupVersion)

// ClusterPolicyResource is what the node role watches when it is served.
var ClusterPolicyResource = cnpGroupVersion.WithResource("clusternetworkpolicies")

// watchCluster registers the Node view, for the nodes peer: a view must
// be registered before the informers start, and the CRD may be installed
// any time after. Called from New.
func (f *Feature) watchCluster(d role.Deps) {
	if d.Client == nil || d.RestConfig == nil {
		return // no API server to ask (a test of the node role's wiring)
	}
	f.views = append(f.views, d.Factory.Register(informer.View{Kind: informer.Nodes, Name: "network-policy",
		Record: func(o runtime.Object) any { return NodeFromAPI(o.(*v1.Node)) }, Sink: &sink{e: f, kind: informer.Nodes}}))
	f.crd = &crdWatch{e: f, synced: make(chan struct{})}
}

// runCluster starts the watch of the CRD, which starts and stops the
// policies' reflector (cnp_crd.go), and returns what says the CRD and,
// if it is served, the policies are listed (nil without an API server).
func (f *Feature) runCluster(ctx context.Context) (cache.DoneChecker, error) {
	if f.crd == nil {
		return nil, nil
	}
	// One connection for both watches, through the gate's transport.
	cfg := f.deps.Factory.Gate().Config(ctx, f.deps.RestConfig)
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("a client of %s: %w", crdResource, err)
	}
	crds, err := apiextensions.NewForConfigAndClient(cfg, hc)
	if err != nil {
		return nil, fmt.Errorf("a client of %s: %w", crdResource, err)
	}
	policies, err := cnpclient.NewForConfigAndClient(cfg, hc)
	if err != nil {
		return nil, fmt.Errorf("a client of %s: %w", ClusterPolicyResource, err)
	}
	f.crd.ctx, f.crd.policies = ctx, policies
	c := crds.ApiextensionsV1().CustomResourceDefinitions()
	f.deps.Factory.RunCustom(ctx, informer.Custom{Kind: "customresourcedefinitions", Name: "network-policy",
		Example: &apiextensionsv1.CustomResourceDefinition{}, Client: crds,
		List:  func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return c.List(ctx, o) },
		Watch: c.Watch, Fields: fields.OneTermEqualSelector("metadata.name", crdName),
		Record: func(o runtime.Object) any { return crdRecordOf(o.(*apiextensionsv1.CustomResourceDefinition)) },
		Sink:   f.crd})
	return f.crd, nil
}

// runPolicies runs the policies' reflector into sink s until ctx ends.
func (f *Feature) runPolicies(ctx context.Context, c cnpclient.PolicyV1beta1Interface, s *sink) cache.DoneChecker {
	src := c.ClusterNetworkPolicies()
	return f.deps.Factory.RunCustom(ctx, informer.Custom{Kind: clusterPolicies, Name: "network-policy",
		Example: &cnpv1.ClusterNetworkPolicy{}, Client: c,
		List:   func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return src.List(ctx, o) },
		Watch:  src.Watch,
		Record: func(o runtime.Object) any { return clusterRecordOf(o.(*cnpv1.ClusterNetworkPolicy)) },
		Sink:   s})
}

// clusterRecord is a ClusterNetworkPolicy compiled, or why it did not.
type clusterPolicyRecord struct {
	meta metav1.ObjectMeta
	pol  *ClusterPolicy
	err  error
}

func clusterRecordOf(p *cnpv1.ClusterNetworkPolicy) *clusterPolicyRecord {
	pol, err := CompileCluster(p)
	return &clusterPolicyRecord{meta: metav1.ObjectMeta{Name: p.Name, UID: p.UID, ResourceVersion: p.ResourceVersion}, pol: pol, err: err}
}

// GetObjectMeta is the record's key, for the informer layer.
func (r *clusterPolicyRecord) GetObjectMeta() metav1.Object { m := r.meta; return &m }

func (r *clusterPolicyRecord) key() types.NamespacedName {
	return types.NamespacedName{Name: r.meta.Name}
}

// upsertCluster applies a ClusterNetworkPolicy record; a policy that does
// not compile keeps its previous version, and one whose rules failed
// closed is enforced so, with a Warning event each. Called with mu held.
func (f *Feature) upsertCluster(r *clusterPolicyRecord) {
	seen := f.clusterReported[r.meta.Name] == r.meta.ResourceVersion
	f.clusterReported[r.meta.Name] = r.meta.ResourceVersion
	if r.err != nil {
		if !seen {
			kept := "nothing of it is enforced"
			if f.model.cl != nil && f.model.cl.policies[r.meta.Name] != nil {
				kept = "its previous version stays in force"
			}
			f.log.Error(r.err, "ClusterNetworkPolicy not enforced", "policy", r.meta.Name, "kept", kept)
			f.clusterEvent(r, "InvalidClusterNetworkPolicy", fmt.Sprintf("not enforced on node %s: %v; %s", f.cfg.NodeName, r.err, kept))
		}
		return
	}
	f.model.UpsertClusterPolicy(r.pol)
	if len(r.pol.Problems) > 0 && !seen {
		msg := strings.Join(r.pol.Problems, "; ")
		f.log.Info("ClusterNetworkPolicy rules fail closed", "policy", r.meta.Name, "rules", msg)
		f.clusterEvent(r, "ClusterNetworkPolicyRuleFailedClosed", fmt.Sprintf("on node %s: %s", f.cfg.NodeName, msg))
	}
}

func (f *Feature) clusterEvent(r *clusterPolicyRecord, reason, msg string) {
	if f.recorder == nil {
		return
	}
	obj := &cnpv1.ClusterNetworkPolicy{ObjectMeta: r.meta}
	obj.APIVersion, obj.Kind = cnpGroupVersion.String(), "ClusterNetworkPolicy" // no scheme knows the type
	f.recorder.Event(obj, v1.EventTypeWarning, reason, msg)
}

// clusterRecords are stand-ins for the ClusterNetworkPolicy and Node
// records the model holds, enough to remove them. Called with mu held.
func (f *Feature) clusterRecords(kind informer.Kind) []any {
	var out []any
	if f.model.cl == nil {
		return nil
	}
	switch kind {
	case clusterPolicies:
		for name := range f.model.cl.policies {
			out = append(out, &clusterPolicyRecord{meta: metav1.ObjectMeta{Name: name}})
		}
	case informer.Nodes:
		for name := range f.model.cl.nodes {
			out = append(out, &Node{Name: name})
		}
	}
	return out
}
