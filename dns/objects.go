package dns

import (
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
		return &corev1.Pod{
			ObjectMeta: slimMeta(o.ObjectMeta),
			Status:     corev1.PodStatus{Phase: o.Status.Phase, PodIP: o.Status.PodIP, PodIPs: o.Status.PodIPs},
		}, nil
	case *corev1.Namespace:
		return &corev1.Namespace{ObjectMeta: slimMeta(o.ObjectMeta)}, nil
	}
	return obj, nil
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
