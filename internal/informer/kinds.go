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
	fields func(runtime.Object) fields.Set
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

func metaFields(obj runtime.Object) fields.Set {
	m, err := metaOf(obj)
	if err != nil {
		return fields.Set{}
	}
	return fields.Set{"metadata.name": m.GetName(), "metadata.namespace": m.GetNamespace()}
}

func podFields(obj runtime.Object) fields.Set {
	s := metaFields(obj)
	if p, ok := obj.(*corev1.Pod); ok {
		s["spec.nodeName"] = p.Spec.NodeName
		s["status.phase"] = string(p.Status.Phase)
	}
	return s
}
