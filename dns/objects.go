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
		return sliceOf(o)
	case *corev1.Namespace:
		return &nsInfo{metaOf(o.ObjectMeta)}
	}
	return obj
}

// nsInfo is what the Namespace view keeps: that the namespace exists.
// A slimmed corev1.Namespace, its metadata's empty fields and all, was
// 400 bytes: 4 MB at 10,000 namespaces.
type nsInfo struct{ objMeta }

func (n *nsInfo) DeepCopyObject() runtime.Object {
	c := *n
	return &c
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

// sliceInfo is what the EndpointSlice view keeps: the key, the Service
// it belongs to, its trigger time, and its ready endpoints as the records
// DNS answers from. The Service's records share the slice's list
// (records.go). Kept as a slimmed
// discoveryv1.EndpointSlice, a slice's endpoints took about 140 bytes
// each beside the Service's copy; now one copy of 48 and its name.
type sliceInfo struct {
	objMeta
	service string     // the kubernetes.io/service-name label
	trigger string     // the last-change-trigger-time annotation
	eps     []endpoint // ready, one per address, sorted by address
}

// DeepCopyObject and GetObjectKind make records runtime.Objects, which a
// list holds as they are (internal/informer).
func (s *sliceInfo) DeepCopyObject() runtime.Object {
	c := *s
	return &c
}

func sliceOf(o *discoveryv1.EndpointSlice) *sliceInfo {
	return &sliceInfo{objMeta: metaOf(o.ObjectMeta), service: o.Labels[discoveryv1.LabelServiceName],
		trigger: o.Annotations[triggerTimeAnnotation], eps: readyEndpoints(o)}
}
