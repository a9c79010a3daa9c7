package policy

import (
	"context"
	"fmt"
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/tools/cache"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	cnpclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned/typed/apis/v1beta1"

	"github.com/netplane/netplane/internal/informer"
	"github.com/netplane/netplane/internal/role"
)

// This file is the feature's ClusterNetworkPolicy part: when the API
// server serves clusternetworkpolicies.policy.networking.k8s.io v1beta1
// (its CRD is installed; asked once, at start), a reflector of the policies
// and a Node view (for the nodes peer) write into the model like the
// NetworkPolicy views. Without the CRD the node enforces NetworkPolicy
// alone and says so once.

// clusterPolicies is the sink kind of ClusterNetworkPolicy records.
const clusterPolicies informer.Kind = "clusternetworkpolicies"

// cnpGroupVersion is the API group version of ClusterNetworkPolicy.
var cnpGroupVersion = schema.GroupVersion(cnpv1.GroupVersion)

// ClusterPolicyResource is what the node role watches when it is served.
var ClusterPolicyResource = cnpGroupVersion.WithResource("clusternetworkpolicies")

// clusterServed says whether the API server serves ClusterNetworkPolicy
// v1beta1; an error other than "not found" is the caller's to report.
func clusterServed(d discovery.DiscoveryInterface) (bool, error) {
	list, err := d.ServerResourcesForGroupVersion(cnpGroupVersion.String())
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("asking the API server whether it serves %s: %w", ClusterPolicyResource, err)
	}
	for _, r := range list.APIResources {
		if r.Name == ClusterPolicyResource.Resource {
			return true, nil
		}
	}
	return false, nil
}

// watchCluster registers the Node view and makes the policies' reflector
// when the CRD is installed. Called from New, before the informers start.
func (e *Feature) watchCluster(d role.Deps) error {
	if d.Client == nil || d.RestConfig == nil {
		return nil // no API server to ask (a test of the node role's wiring)
	}
	served, err := clusterServed(d.Client.Discovery())
	if err != nil {
		return err
	}
	if !served {
		e.log.Info("the ClusterNetworkPolicy CRD is not installed: enforcing NetworkPolicy only", "resource", ClusterPolicyResource.String())
		return nil
	}
	c, err := cnpclient.NewForConfig(d.RestConfig)
	if err != nil {
		return fmt.Errorf("a client of %s: %w", ClusterPolicyResource, err)
	}
	e.clusterSource = c.ClusterNetworkPolicies()
	e.views = append(e.views, d.Factory.Register(informer.View{Kind: informer.Nodes, Name: "network-policy",
		Record: func(o runtime.Object) any { return NodeFromAPI(o.(*v1.Node)) }, Sink: &sink{e: e, kind: informer.Nodes}}))
	return nil
}

// runCluster starts the policies' reflector, if any, and returns what
// says it has listed them (nil for none).
func (e *Feature) runCluster(ctx context.Context) cache.DoneChecker {
	if e.clusterSource == nil {
		return nil
	}
	src := e.clusterSource
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return src.List(ctx, o) },
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return src.Watch(ctx, o)
		},
	}
	st := &clusterStore{s: &sink{e: e, kind: clusterPolicies}, done: make(chan struct{})}
	rf := cache.NewReflectorWithOptions(lw, &cnpv1.ClusterNetworkPolicy{}, st, cache.ReflectorOptions{Name: "network-policy " + string(clusterPolicies)})
	go rf.RunWithContext(ctx)
	return st
}

// clusterStore is the reflector's store: it hands the sink records, not
// objects, and is done with the first list.
type clusterStore struct {
	s    *sink
	once sync.Once
	done chan struct{}
}

func clusterRecord(obj any) any {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if p, ok := obj.(*cnpv1.ClusterNetworkPolicy); ok {
		return clusterRecordOf(p)
	}
	return obj
}

func (c *clusterStore) Add(obj any) error    { return c.s.Add(clusterRecord(obj)) }
func (c *clusterStore) Update(obj any) error { return c.s.Update(clusterRecord(obj)) }
func (c *clusterStore) Delete(obj any) error { return c.s.Delete(clusterRecord(obj)) }
func (c *clusterStore) Replace(list []any, rv string) error {
	recs := make([]any, len(list))
	for i, o := range list {
		recs[i] = clusterRecord(o)
	}
	err := c.s.Replace(recs, rv)
	c.once.Do(func() { close(c.done) })
	return err
}
func (c *clusterStore) Resync() error                        { return nil }
func (c *clusterStore) List() []any                          { return nil }
func (c *clusterStore) ListKeys() []string                   { return nil }
func (c *clusterStore) Get(any) (any, bool, error)           { return nil, false, nil }
func (c *clusterStore) GetByKey(string) (any, bool, error)   { return nil, false, nil }
func (c *clusterStore) LastStoreSyncResourceVersion() string { return "" }
func (c *clusterStore) Bookmark(string)                      {}
func (c *clusterStore) Name() string                         { return "network-policy " + string(clusterPolicies) }
func (c *clusterStore) Done() <-chan struct{}                { return c.done }

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
func (e *Feature) upsertCluster(r *clusterPolicyRecord) {
	seen := e.clusterReported[r.meta.Name] == r.meta.ResourceVersion
	e.clusterReported[r.meta.Name] = r.meta.ResourceVersion
	if r.err != nil {
		if !seen {
			kept := "nothing of it is enforced"
			if e.model.cl != nil && e.model.cl.policies[r.meta.Name] != nil {
				kept = "its previous version stays in force"
			}
			e.log.Error(r.err, "ClusterNetworkPolicy not enforced", "policy", r.meta.Name, "kept", kept)
			e.clusterEvent(r, "InvalidClusterNetworkPolicy", fmt.Sprintf("not enforced on node %s: %v; %s", e.cfg.NodeName, r.err, kept))
		}
		return
	}
	e.model.UpsertClusterPolicy(r.pol)
	if len(r.pol.Problems) > 0 && !seen {
		msg := strings.Join(r.pol.Problems, "; ")
		e.log.Info("ClusterNetworkPolicy rules fail closed", "policy", r.meta.Name, "rules", msg)
		e.clusterEvent(r, "ClusterNetworkPolicyRuleFailedClosed", fmt.Sprintf("on node %s: %s", e.cfg.NodeName, msg))
	}
}

func (e *Feature) clusterEvent(r *clusterPolicyRecord, reason, msg string) {
	if e.recorder == nil {
		return
	}
	obj := &cnpv1.ClusterNetworkPolicy{ObjectMeta: r.meta}
	obj.APIVersion, obj.Kind = cnpGroupVersion.String(), "ClusterNetworkPolicy" // no scheme knows the type
	e.recorder.Event(obj, v1.EventTypeWarning, reason, msg)
}

// clusterRecords are stand-ins for the ClusterNetworkPolicy and Node
// records the model holds, enough to remove them. Called with mu held.
func (e *Feature) clusterRecords(kind informer.Kind) []any {
	var out []any
	if e.model.cl == nil {
		return nil
	}
	switch kind {
	case clusterPolicies:
		for name := range e.model.cl.policies {
			out = append(out, &clusterPolicyRecord{meta: metav1.ObjectMeta{Name: name}})
		}
	case informer.Nodes:
		for name := range e.model.cl.nodes {
			out = append(out, &Node{Name: name})
		}
	}
	return out
}
