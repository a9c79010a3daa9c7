package endpointslice

import (
	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"
)

// Indexes on the shared Pod and EndpointSlice caches, so that a sync finds
// a Service's pods and slices without scanning its namespace.
// kube-controller-manager lists a Service's pods by matching the selector
// against every pod of the namespace (55,000 in the benchmark) on every
// sync; here a sync reads the pods carrying one of the selector's labels.
const (
	// podLabelIndex maps "namespace/key=value" to the pods with that label.
	podLabelIndex = "netplane.io/label"
	// sliceServiceIndex maps "namespace/service" to the slices labelled
	// with that Service (kubernetes.io/service-name).
	sliceServiceIndex = "netplane.io/service"
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
