package charts

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/netplane/netplane/e2e/framework"
)

func TestMain(m *testing.M) { framework.RunShared(m) }

// sharedAPIServer is the package's API server; the ServiceAccount admission
// plugin stays on, as in a real cluster the chart is installed into.
func sharedAPIServer(t *testing.T) *framework.APIServer {
	return framework.SharedAPIServer(t, framework.Options{Admission: true})
}

// apply server-side-applies objs; with dryRun nothing is stored.
func apply(t *testing.T, s *framework.APIServer, objs []*unstructured.Unstructured, dryRun bool) {
	t.Helper()
	if err := applyObjects(framework.Ctx(t), s.RestConfig, objs, dryRun); err != nil {
		t.Error(err)
	}
}

// applyObjects server-side-applies objs and returns every refusal.
func applyObjects(ctx context.Context, cfg *rest.Config, objs []*unstructured.Unstructured, dryRun bool) error {
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc))
	opts := metav1.PatchOptions{FieldManager: "netplane-chart-test", Force: ptr(true)}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	var errs []error
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s %s: %w", gvk.Kind, o.GetName(), err))
			continue
		}
		data, _ := json.Marshal(o.Object)
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if o.GetNamespace() != "" {
			ri = dyn.Resource(m.Resource).Namespace(o.GetNamespace())
		}
		if _, err := ri.Patch(ctx, o.GetName(), types.ApplyPatchType, data, opts); err != nil {
			errs = append(errs, fmt.Errorf("the API server refused %s %s/%s: %w", gvk.Kind, o.GetNamespace(), o.GetName(), err))
		}
	}
	return errors.Join(errs...)
}

func ptr[T any](v T) *T { return &v }

func TestEveryRenderedObjectIsAcceptedByTheAPIServer(t *testing.T) {
	s := sharedAPIServer(t)
	variants := []struct {
		name   string
		values map[string]any
	}{
		{"defaults", nil},
		{"dual-stack node with an endpoint", map[string]any{"node": map[string]any{
			"controlPlaneEndpoint": "https://192.0.2.10:6443",
			"config":               map[string]any{"clusterCIDRs": []any{"10.244.0.0/16", "fd00:10:244::/56"}, "nodePortAddresses": []any{"primary"}},
		}}},
		{"single controller without leader election", map[string]any{"controller": map[string]any{
			"replicas": 1, "config": map[string]any{"leaderElection": map[string]any{"leaderElect": false}},
		}}},
		{"dns only, custom domain and IP", map[string]any{
			"controller": map[string]any{"enabled": false}, "node": map[string]any{"enabled": false},
			"dns": map[string]any{"config": map[string]any{"clusterDomain": "corp.internal", "upstreamServers": []any{"192.0.2.53"}}, "service": map[string]any{"name": "kube-dns", "clusterIP": "10.96.0.53"}},
		}},
		{"encryption with WireGuard", wireguardValues},
		{"pod relays", relayValues},
		{"private image and extra flags", map[string]any{
			"image":            map[string]any{"repository": "registry.example/netplane", "tag": "v9", "pullPolicy": "Always"},
			"imagePullSecrets": []any{map[string]any{"name": "regcred"}},
			"logVerbosity":     4,
			"dns":              map[string]any{"extraArgs": []any{"--cache-size=20000"}},
		}},
	}
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			objs := render(t, v.values)
			apply(t, s, objs, true)
			t.Logf("%d objects accepted with server-side dry-run", len(objs))
		})
	}
}

// access is one question to the API server's authorizer; resource may
// name one object, as "resource:name".
type access struct {
	verb, group, resource, namespace string
}

func (a access) String() string {
	return fmt.Sprintf("%s %s.%s in %q", a.verb, a.resource, a.group, a.namespace)
}

func TestEachRoleMayDoExactlyWhatItNeeds(t *testing.T) {
	s := sharedAPIServer(t)
	apply(t, s, render(t, relayValues), false)
	const ns = namespace
	cases := []struct {
		role    string
		allowed []access
		denied  []access
	}{
		{"controller",
			[]access{
				{"list", "", "services", ""}, {"watch", "", "pods", ""}, {"list", "", "nodes", ""}, {"watch", "", "endpoints", ""},
				{"create", "discovery.k8s.io", "endpointslices", "default"}, {"update", "discovery.k8s.io", "endpointslices", "default"},
				{"delete", "discovery.k8s.io", "endpointslices", "default"}, {"create", "", "events", "default"},
				{"get", "coordination.k8s.io", "leases", ns}, {"update", "coordination.k8s.io", "leases", ns},
			},
			[]access{
				{"get", "", "secrets", "default"}, {"create", "", "pods/exec", "default"}, {"update", "", "services", "default"},
				{"create", "", "endpoints", "default"}, {"update", "coordination.k8s.io", "leases", "default"}, {"delete", "", "pods", "default"},
			}},
		{"dns",
			[]access{
				{"list", "", "services", ""}, {"watch", "", "services", ""}, {"list", "discovery.k8s.io", "endpointslices", ""},
				{"watch", "", "namespaces", ""}, {"list", "", "pods", ""},
			},
			[]access{
				{"get", "", "secrets", ns}, {"create", "", "pods/exec", "default"}, {"update", "", "services", "default"},
				{"create", "discovery.k8s.io", "endpointslices", "default"}, {"list", "", "nodes", ""}, {"create", "", "events", "default"},
			}},
		{"node",
			[]access{
				{"list", "", "services", ""}, {"watch", "discovery.k8s.io", "endpointslices", ""}, {"get", "", "nodes", ""}, {"watch", "", "nodes", ""},
				{"create", "", "events", "default"},
				// NetworkPolicy enforcement: policies, and the pods and namespaces they select.
				{"list", "", "pods", ""}, {"watch", "", "namespaces", ""}, {"watch", "networking.k8s.io", "networkpolicies", ""},
				{"watch", "policy.networking.k8s.io", "clusternetworkpolicies", ""}, {"get", "policy.networking.k8s.io", "clusternetworkpolicies", ""},
				// Their CRD, by name: enforcement follows its installation.
				{"watch", "apiextensions.k8s.io", "customresourcedefinitions:" + cnpCRD, ""}, {"list", "apiextensions.k8s.io", "customresourcedefinitions:" + cnpCRD, ""},
			},
			[]access{
				{"get", "", "secrets", ns}, {"create", "", "pods/exec", "default"}, {"update", "", "services", "default"},
				{"update", "", "nodes", ""}, {"patch", "", "nodes", ""}, {"create", "discovery.k8s.io", "endpointslices", "default"},
				{"update", "", "pods", "default"}, {"update", "networking.k8s.io", "networkpolicies", "default"}, {"update", "", "namespaces", ""},
				{"update", "policy.networking.k8s.io", "clusternetworkpolicies", ""}, {"update", "policy.networking.k8s.io", "clusternetworkpolicies/status", ""},
				// No other CRD, nor every CRD, nor a change to its own.
				{"watch", "apiextensions.k8s.io", "customresourcedefinitions", ""}, {"list", "apiextensions.k8s.io", "customresourcedefinitions:gateways.gateway.networking.k8s.io", ""},
				{"update", "apiextensions.k8s.io", "customresourcedefinitions:" + cnpCRD, ""}, {"delete", "apiextensions.k8s.io", "customresourcedefinitions:" + cnpCRD, ""},
			}},
		{"relay",
			[]access{
				{"list", "", "pods", ""}, {"watch", "", "pods", ""},
				// Asking who may read pods from it.
				{"create", "authentication.k8s.io", "tokenreviews", ""}, {"create", "authorization.k8s.io", "subjectaccessreviews", ""},
			},
			[]access{
				{"get", "", "secrets", ns}, {"update", "", "pods", "default"}, {"create", "", "pods/exec", "default"},
				{"list", "", "nodes", ""}, {"list", "", "services", ""}, {"create", "", "serviceaccounts/token", ns},
			}},
	}
	for _, c := range cases {
		user := "system:serviceaccount:" + ns + ":netplane-" + c.role
		t.Run(c.role, func(t *testing.T) {
			for _, a := range c.allowed {
				if !allowed(t, s, user, a) {
					t.Errorf("%s may not %s, which it needs", user, a)
				}
			}
			for _, a := range c.denied {
				if allowed(t, s, user, a) {
					t.Errorf("%s may %s, which it must not", user, a)
				}
			}
		})
	}
}

func allowed(t *testing.T, s *framework.APIServer, user string, a access) bool {
	t.Helper()
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:   user,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Verb: a.verb, Group: a.group, Resource: a.resource, Namespace: a.namespace,
		},
	}}
	if r, name, ok := strings.Cut(a.resource, ":"); ok {
		sar.Spec.ResourceAttributes.Resource, sar.Spec.ResourceAttributes.Name = r, name
	}
	// pods/exec is a subresource in the API's terms.
	if r, sub, ok := cutSub(sar.Spec.ResourceAttributes.Resource); ok {
		sar.Spec.ResourceAttributes.Resource, sar.Spec.ResourceAttributes.Subresource = r, sub
	}
	got, err := s.Client.AuthorizationV1().SubjectAccessReviews().Create(framework.Ctx(t), sar, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return got.Status.Allowed
}

func cutSub(r string) (string, string, bool) {
	for i := range r {
		if r[i] == '/' {
			return r[:i], r[i+1:], true
		}
	}
	return r, "", false
}
