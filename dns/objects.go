package dns

import (
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// triggerTimeAnnotation is set by the EndpointSlice controller to the time
// of the change that caused a slice update; DNS programming latency is
// measured from it.
const triggerTimeAnnotation = "endpoints.kubernetes.io/last-change-trigger-time"

// slim is the record DNS keeps of a Service, an EndpointSlice or a
// Namespace (the informer views' Record): only the fields DNS answers from.
// It returns fresh objects and never changes its input.
func slim(obj runtime.Object) any {
	switch o := obj.(type) {
	case *corev1.Service:
		return &svcInfo{objMeta: metaOf(o.ObjectMeta), spec: serviceSpec(o)}
	case *discoveryv1.EndpointSlice:
		return slimSlice(o)
	case *corev1.Namespace:
		return &corev1.Namespace{ObjectMeta: slimMeta(o.ObjectMeta)}
	}
	return obj
}

// svcInfo is what the Service view keeps: the key, the resource version
// an informer tells updates from resyncs by, and the Service's own records.
// A slim corev1.Service alone would be five times that.
type svcInfo struct {
	objMeta
	spec *service // immutable
}

// DeepCopyObject and GetObjectKind make records runtime.Objects, which a
// list holds as they are (internal/informer).
func (s *svcInfo) DeepCopyObject() runtime.Object {
	c := *s
	return &c
}

// objMeta is the metadata an informer reads, through GetObjectMeta, which
// builds it only when asked.
type objMeta struct{ name, namespace, resourceVersion string }

func metaOf(m metav1.ObjectMeta) objMeta { return objMeta{m.Name, m.Namespace, m.ResourceVersion} }

func (m *objMeta) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Name: m.name, Namespace: m.namespace, ResourceVersion: m.resourceVersion}
}

func (m *objMeta) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

func slimMeta(m metav1.ObjectMeta) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace, ResourceVersion: m.ResourceVersion}
}

func slimSlice(o *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{ObjectMeta: slimMeta(o.ObjectMeta), AddressType: o.AddressType, Ports: o.Ports}
	if v, ok := o.Labels[discoveryv1.LabelServiceName]; ok {
		s.Labels = map[string]string{discoveryv1.LabelServiceName: v}
	}
	if v, ok := o.Annotations[triggerTimeAnnotation]; ok {
		s.Annotations = map[string]string{triggerTimeAnnotation: v}
	}
	for _, e := range o.Endpoints {
		if e.Conditions.Ready != nil && !*e.Conditions.Ready {
			continue // never answered; not worth its memory
		}
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
			Addresses:  e.Addresses,
			Conditions: discoveryv1.EndpointConditions{Ready: e.Conditions.Ready},
			Hostname:   e.Hostname,
		})
	}
	return s
}
