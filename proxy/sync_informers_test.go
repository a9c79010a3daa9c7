package proxy

import (
	"reflect"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
)

func TestSlimObjectKeepsWhatTheProxyReads(t *testing.T) {
	managed := []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}
	owners := []metav1.OwnerReference{{Kind: "Service", Name: "s"}}
	cases := []struct {
		name     string
		in, want any
	}{
		{"service loses managedFields, owners, last-applied and its selector, keeps labels and other annotations",
			&v1.Service{ObjectMeta: metav1.ObjectMeta{Name: "s", ManagedFields: managed, OwnerReferences: owners,
				Labels:      map[string]string{"service.kubernetes.io/service-proxy-name": "other"},
				Annotations: map[string]string{v1.LastAppliedConfigAnnotation: "{...}", "service.kubernetes.io/topology-mode": "Auto"}},
				Spec: v1.ServiceSpec{ClusterIP: "10.96.0.10", Selector: map[string]string{"app": "a"}}},
			&v1.Service{ObjectMeta: metav1.ObjectMeta{Name: "s",
				Labels:      map[string]string{"service.kubernetes.io/service-proxy-name": "other"},
				Annotations: map[string]string{"service.kubernetes.io/topology-mode": "Auto"}},
				Spec: v1.ServiceSpec{ClusterIP: "10.96.0.10"}}},
		{"slice keeps only the trigger time annotation and the Service name label, drops owners, targetRef and hostname",
			&discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "e", ManagedFields: managed, OwnerReferences: owners,
				Labels:      map[string]string{discovery.LabelServiceName: "s", discovery.LabelManagedBy: "m"},
				Annotations: map[string]string{v1.EndpointsLastChangeTriggerTime: "2026-01-01T00:00:00Z", "x": "y"}},
				Endpoints: []discovery.Endpoint{{Addresses: []string{"10.0.0.1"}, TargetRef: &v1.ObjectReference{Kind: "Pod", Name: "p"},
					Hostname: ptrTo("h"), DeprecatedTopology: map[string]string{"a": "b"}, Zone: ptrTo("z")}}},
			&discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "e",
				Labels:      map[string]string{discovery.LabelServiceName: "s"},
				Annotations: map[string]string{v1.EndpointsLastChangeTriggerTime: "2026-01-01T00:00:00Z"}},
				Endpoints: []discovery.Endpoint{{Addresses: []string{"10.0.0.1"}, Zone: ptrTo("z")}}}},
		{"slice without a trigger time has no annotations",
			&discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "e", Annotations: map[string]string{"x": "y"}}},
			&discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "e"}}},
		{"a Node passes untouched",
			&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", ManagedFields: managed}},
			&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", ManagedFields: managed}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := slimObject(c.in)
			if err != nil || !reflect.DeepEqual(got, c.want) {
				t.Errorf("slimObject = %#v, %v\nwant %#v", got, err, c.want)
			}
		})
	}
}

func TestSlimInformersFeedTheFactorysListers(t *testing.T) {
	managed := []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}
	client := fake.NewClientset(
		&v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s", ManagedFields: managed}},
		&discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "e", ManagedFields: managed}})
	f := informers.NewSharedInformerFactory(client, 0)
	slimInformers(f, nil)
	svcs, slices := f.Core().V1().Services().Lister(), f.Discovery().V1().EndpointSlices().Lister()
	stop := make(chan struct{})
	defer close(stop)
	f.Start(stop)
	f.WaitForCacheSync(stop)
	s, err := svcs.Services("ns").Get("s")
	if err != nil || s.ManagedFields != nil {
		t.Errorf("Service from the factory's lister: %v, managedFields %v; want it, without them", err, s.ManagedFields)
	}
	e, err := slices.EndpointSlices("ns").Get("e")
	if err != nil || e.ManagedFields != nil {
		t.Errorf("EndpointSlice from the factory's lister: %v, managedFields %v; want it, without them", err, e.ManagedFields)
	}
}

func TestProxyInformersSkipOtherProxiesAndHeadlessServices(t *testing.T) {
	meta := func(name string, labels map[string]string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: labels}
	}
	other := map[string]string{labelServiceProxyName: "other-proxy"}
	client := fake.NewClientset(
		&v1.Service{ObjectMeta: meta("mine", nil)},
		&v1.Service{ObjectMeta: meta("theirs", other)},
		&discovery.EndpointSlice{ObjectMeta: meta("mine-1", map[string]string{discovery.LabelServiceName: "mine"})},
		&discovery.EndpointSlice{ObjectMeta: meta("theirs-1", map[string]string{discovery.LabelServiceName: "theirs", labelServiceProxyName: "other-proxy"})},
		&discovery.EndpointSlice{ObjectMeta: meta("headless-1", map[string]string{discovery.LabelServiceName: "headless", labelHeadless: ""})})
	f := proxyInformers(client)
	svcLister, sliceLister := f.Core().V1().Services().Lister(), f.Discovery().V1().EndpointSlices().Lister()
	stop := make(chan struct{})
	defer close(stop)
	f.Start(stop)
	f.WaitForCacheSync(stop)
	gotSvcs, _ := svcLister.List(labels.Everything())
	gotSlices, _ := sliceLister.List(labels.Everything())
	var names []string
	for _, s := range gotSvcs {
		names = append(names, "service "+s.Name)
	}
	for _, s := range gotSlices {
		names = append(names, "slice "+s.Name)
	}
	slices.Sort(names)
	if want := []string{"service mine", "slice mine-1"}; !slices.Equal(names, want) {
		t.Errorf("the proxy's informers hold %v, want %v", names, want)
	}
}

func ptrTo[T any](v T) *T { return &v }
