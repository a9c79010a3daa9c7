package informer

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// Kind is a resource netplane watches.
type Kind string

// The resources the roles read.
const (
	Services        Kind = "services"
	EndpointSlices  Kind = "endpointslices"
	Endpoints       Kind = "endpoints"
	Pods            Kind = "pods"
	Nodes           Kind = "nodes"
	Namespaces      Kind = "namespaces"
	NetworkPolicies Kind = "networkpolicies"
)

type (
	listFunc  func(context.Context, metav1.ListOptions) (runtime.Object, error)
	watchFunc func(context.Context, metav1.ListOptions) (watch.Interface, error)
)

// kind is how one resource is listed and watched.
type kind struct {
	example runtime.Object
	calls   func(kubernetes.Interface) (listFunc, watchFunc)
	// fields are an object's fields a Fields selector may name: the ones
	// the API server also selects by, so a lone view's selector can be
	// sent to it.
	fields func(runtime.Object) fields.Fields
}

var kinds = map[Kind]kind{
	Services: {&corev1.Service{}, func(c kubernetes.Interface) (listFunc, watchFunc) {
		i := c.CoreV1().Services(metav1.NamespaceAll)
		return func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return i.List(ctx, o) }, i.Watch
	}, metaFields},
	EndpointSlices: {&discoveryv1.EndpointSlice{}, func(c kubernetes.Interface) (listFunc, watchFunc) {
		i := c.DiscoveryV1().EndpointSlices(metav1.NamespaceAll)
		return func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return i.List(ctx, o) }, i.Watch
	}, metaFields},
	//lint:ignore SA1019 the mirroring controller reads user-written Endpoints
	Endpoints: {&corev1.Endpoints{}, func(c kubernetes.Interface) (listFunc, watchFunc) {
		i := c.CoreV1().Endpoints(metav1.NamespaceAll)
		return func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return i.List(ctx, o) }, i.Watch
	}, metaFields},
	Pods: {&corev1.Pod{}, func(c kubernetes.Interface) (listFunc, watchFunc) {
		i := c.CoreV1().Pods(metav1.NamespaceAll)
		return func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return i.List(ctx, o) }, i.Watch
	}, podFields},
	Nodes: {&corev1.Node{}, func(c kubernetes.Interface) (listFunc, watchFunc) {
		i := c.CoreV1().Nodes()
		return func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return i.List(ctx, o) }, i.Watch
	}, metaFields},
	Namespaces: {&corev1.Namespace{}, func(c kubernetes.Interface) (listFunc, watchFunc) {
		i := c.CoreV1().Namespaces()
		return func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return i.List(ctx, o) }, i.Watch
	}, metaFields},
	NetworkPolicies: {&networkingv1.NetworkPolicy{}, func(c kubernetes.Interface) (listFunc, watchFunc) {
		i := c.NetworkingV1().NetworkPolicies(metav1.NamespaceAll)
		return func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return i.List(ctx, o) }, i.Watch
	}, metaFields},
}

func metaOf(obj any) (metav1.Object, error) { return meta.Accessor(obj) }

func metaFields(obj runtime.Object) fields.Fields {
	m, _ := metaOf(obj)
	return objectFields{meta: m}
}

func podFields(obj runtime.Object) fields.Fields {
	m, _ := metaOf(obj)
	p, _ := obj.(*corev1.Pod)
	return objectFields{meta: m, pod: p}
}

// objectFields are an object's selectable fields, read when a selector
// asks: a selector is matched against every object a shared resource
// lists, and a map of fields per pod would be garbage by the megabyte.
type objectFields struct {
	meta metav1.Object // nil for an object without metadata
	pod  *corev1.Pod   // nil for other kinds
}

func (f objectFields) Has(field string) bool {
	_, ok := f.get(field)
	return ok
}

func (f objectFields) Get(field string) string {
	v, _ := f.get(field)
	return v
}

func (f objectFields) get(field string) (string, bool) {
	switch {
	case f.meta == nil:
	case field == "metadata.name":
		return f.meta.GetName(), true
	case field == "metadata.namespace":
		return f.meta.GetNamespace(), true
	case f.pod == nil:
	case field == "spec.nodeName":
		return f.pod.Spec.NodeName, true
	case field == "status.phase":
		return string(f.pod.Status.Phase), true
	}
	return "", false
}
