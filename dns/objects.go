package dns

import (
	"net/netip"
	"slices"

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

// slim is the informers' transform: it keeps only the fields DNS answers
// from, so the caches of a cluster with 50,000 pods hold names and
// addresses rather than whole pod specs. It returns fresh objects and never
// changes its input.
func slim(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Service:
		return slimService(o), nil
	case *discoveryv1.EndpointSlice:
		return slimSlice(o), nil
	case *corev1.Pod:
		return &podInfo{name: o.Name, namespace: o.Namespace, resourceVersion: o.ResourceVersion, addrs: podAddrs(o)}, nil
	case *corev1.Namespace:
		return &corev1.Namespace{ObjectMeta: slimMeta(o.ObjectMeta)}, nil
	}
	return obj, nil
}

// podInfo is all DNS keeps of a Pod, 70 bytes: even a zeroed corev1.Pod or
// metav1.ObjectMeta would cost hundreds, times every pod in the cluster.
// The informer's store reaches its name through GetObjectMeta, which builds
// the metadata only when asked.
type podInfo struct {
	name, namespace, resourceVersion string
	addrs                            []netip.Addr // none once the pod has finished
}

func (p *podInfo) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Name: p.name, Namespace: p.namespace, ResourceVersion: p.resourceVersion}
}

func (p *podInfo) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

func (p *podInfo) DeepCopyObject() runtime.Object {
	c := *p
	c.addrs = slices.Clone(p.addrs)
	return &c
}

// podAddrs are the addresses of a pod that holds them: a finished pod has
// given its addresses back, and they may already be another pod's.
func podAddrs(pod *corev1.Pod) []netip.Addr {
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return nil
	}
	ips := pod.Status.PodIPs
	if len(ips) == 0 && pod.Status.PodIP != "" {
		ips = []corev1.PodIP{{IP: pod.Status.PodIP}}
	}
	var out []netip.Addr
	for _, ip := range ips {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			out = append(out, a.Unmap())
		}
	}
	return out
}

func slimMeta(m metav1.ObjectMeta) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace, ResourceVersion: m.ResourceVersion}
}

func slimService(o *corev1.Service) *corev1.Service {
	s := &corev1.Service{ObjectMeta: slimMeta(o.ObjectMeta)}
	s.Spec.Type = o.Spec.Type
	s.Spec.ClusterIP = o.Spec.ClusterIP
	s.Spec.ClusterIPs = o.Spec.ClusterIPs
	s.Spec.ExternalName = o.Spec.ExternalName
	for _, p := range o.Spec.Ports {
		s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: p.Name, Protocol: p.Protocol, Port: p.Port})
	}
	return s
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
