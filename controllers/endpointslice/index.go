package endpointslice

import (
	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/tools/cache"
	esutil "k8s.io/endpointslice/util"
)

// Indexes on the shared Pod, Service and EndpointSlice caches, so that a
// sync finds a Service's pods and slices, and a pod change its Services,
// without scanning its namespace. kube-controller-manager lists a Service's
// pods by matching the selector against every pod of the namespace (55,000
// in the benchmark) on every sync, and a pod's Services by matching every
// Service's selector on every pod event; here a sync reads the pods
// carrying one of the selector's labels, and a pod event the Services
// selecting one of the pod's labels.
const (
	// podLabelIndex maps "namespace/key=value" to the pods with that label.
	podLabelIndex = "netplane.io/label"
	// sliceServiceIndex maps "namespace/service" to the slices labelled
	// with that Service (kubernetes.io/service-name).
	sliceServiceIndex = "netplane.io/service"
	// serviceSelectorIndex maps "namespace/key=value" to the Services whose
	// selector has that label, and "namespace/" to those whose selector is
	// empty (it selects every pod); a Service without a selector selects
	// nothing and is in no bucket.
	serviceSelectorIndex = "netplane.io/selector"
)

func podLabelKeys(obj any) ([]string, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return nil, nil
	}
	out := make([]string, 0, len(p.Labels))
	for k, v := range p.Labels {
		out = append(out, labelIndexKey(p.Namespace, k, v))
	}
	return out, nil
}

func labelIndexKey(ns, k, v string) string { return ns + "/" + k + "=" + v }

func sliceServiceKeys(obj any) ([]string, error) {
	s, ok := obj.(*discovery.EndpointSlice)
	if !ok {
		return nil, nil
	}
	svc, ok := s.Labels[discovery.LabelServiceName]
	if !ok {
		return nil, nil
	}
	return []string{s.Namespace + "/" + svc}, nil
}

// selectPods returns the pods of namespace ns matching selector, as
// PodLister.List would (in no particular order): it reads the smallest
// index bucket of the selector's labels and filters it. An empty selector
// matches every pod of the namespace.
func selectPods(idx cache.Indexer, lister func(labels.Selector) ([]*corev1.Pod, error), ns string, selector map[string]string) ([]*corev1.Pod, error) {
	sel := labels.Set(selector).AsSelectorPreValidated()
	if len(selector) == 0 {
		return lister(sel)
	}
	bucket, size := "", -1
	for k, v := range selector {
		key := labelIndexKey(ns, k, v)
		if len(selector) == 1 {
			bucket = key
			break
		}
		keys, err := idx.IndexKeys(podLabelIndex, key)
		if err != nil {
			return nil, err
		}
		if size < 0 || len(keys) < size {
			bucket, size = key, len(keys)
		}
	}
	objs, err := idx.ByIndex(podLabelIndex, bucket)
	if err != nil {
		return nil, err
	}
	out := make([]*corev1.Pod, 0, len(objs))
	for _, obj := range objs {
		if p, ok := obj.(*corev1.Pod); ok && sel.Matches(labels.Set(p.Labels)) {
			out = append(out, p)
		}
	}
	return out, nil
}

func serviceSelectorKeys(obj any) ([]string, error) {
	s, ok := obj.(*corev1.Service)
	if !ok || s.Spec.Selector == nil {
		return nil, nil
	}
	if len(s.Spec.Selector) == 0 {
		return []string{s.Namespace + "/"}, nil
	}
	out := make([]string, 0, len(s.Spec.Selector))
	for k, v := range s.Spec.Selector {
		out = append(out, labelIndexKey(s.Namespace, k, v))
	}
	return out, nil
}

// servicesToUpdate returns the keys of the Services a pod change affects,
// as esutil.GetServicesToUpdate does (the Services selecting the pod, and
// with a label change those that selected it before: all of them if the
// endpoint changed too, else those it joined or left), reading the
// selector index instead of every Service of the namespace.
func servicesToUpdate(idx cache.Indexer, key *esutil.PodProjectionKey) (sets.Set[string], error) {
	services, err := servicesSelecting(idx, key.Namespace, key.Labels)
	if err != nil || key.OldLabels == nil {
		return services, err
	}
	old, err := servicesSelecting(idx, key.Namespace, key.OldLabels)
	if err != nil {
		return nil, err
	}
	if key.PodChanged {
		return services.Union(old), nil
	}
	return services.SymmetricDifference(old), nil
}

// servicesSelecting returns the keys of the Services of namespace ns whose
// selector matches podLabels.
func servicesSelecting(idx cache.Indexer, ns string, podLabels labels.Set) (sets.Set[string], error) {
	out := sets.Set[string]{}
	add := func(bucket string) error {
		objs, err := idx.ByIndex(serviceSelectorIndex, bucket)
		for _, obj := range objs {
			if s, ok := obj.(*corev1.Service); ok && labels.ValidatedSetSelector(s.Spec.Selector).Matches(podLabels) {
				out.Insert(s.Namespace + "/" + s.Name)
			}
		}
		return err
	}
	if err := add(ns + "/"); err != nil {
		return nil, err
	}
	for k, v := range podLabels {
		if err := add(labelIndexKey(ns, k, v)); err != nil {
			return nil, err
		}
	}
	return out, nil
}
