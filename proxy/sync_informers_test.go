package proxy

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	apiwatch "k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"github.com/netplane/netplane/internal/informer"
)

func TestRecordsKeepWhatTheProxyReads(t *testing.T) {
	trigger := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	managed := []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}
	rec := &sliceRecord{recordMeta: recordMeta{"ns", "e", "7"}}
	cases := []struct {
		name     string
		in, want any
	}{
		{"a Service keeps its keys, resourceVersion and ports",
			&v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s", ResourceVersion: "5", ManagedFields: managed},
				Spec: v1.ServiceSpec{ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"}, Selector: map[string]string{"app": "a"},
					Ports: []v1.ServicePort{{Name: "dns", Protocol: v1.ProtocolUDP, Port: 53}}}},
			&serviceRecord{recordMeta: recordMeta{"ns", "s", "5"}, ports: []servicePort{{Service: types.NamespacedName{Namespace: "ns", Name: "s"},
				Name: "dns", Protocol: v1.ProtocolUDP, Port: 53, ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")}}}}},
		{"a headless Service has no ports",
			&v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "h"},
				Spec: v1.ServiceSpec{ClusterIP: v1.ClusterIPNone, Ports: []v1.ServicePort{{Port: 80, Protocol: v1.ProtocolTCP}}}},
			&serviceRecord{recordMeta: recordMeta{"ns", "h", ""}}},
		{"a slice keeps its Service, trigger time, ports and endpoints with the API's defaults",
			&discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "e", ResourceVersion: "7", ManagedFields: managed,
				Labels:      map[string]string{discovery.LabelServiceName: "s", discovery.LabelManagedBy: "m"},
				Annotations: map[string]string{v1.EndpointsLastChangeTriggerTime: "2026-01-01T00:00:00Z", "x": "y"}},
				AddressType: discovery.AddressTypeIPv4,
				Ports: []discovery.EndpointPort{{Port: ptrTo[int32](80)}, {Name: ptrTo("d"), Protocol: ptrTo(v1.ProtocolUDP), Port: ptrTo[int32](53)},
					{Name: ptrTo("none")}, {Name: ptrTo("big"), Port: ptrTo[int32](70000)}},
				Endpoints: []discovery.Endpoint{
					{Addresses: []string{"10.0.0.1"}, TargetRef: &v1.ObjectReference{Kind: "Pod", Name: "p"}, Hostname: ptrTo("h"),
						NodeName: ptrTo("n1"), Zone: ptrTo("z"), Hints: &discovery.EndpointHints{ForZones: []discovery.ForZone{{Name: "z"}}, ForNodes: []discovery.ForNode{{Name: "n1"}}}},
					{Addresses: []string{"10.0.0.2"}, Conditions: discovery.EndpointConditions{Ready: ptrTo(false), Terminating: ptrTo(true)}},
					{Addresses: []string{"10.0.0.3"}, Conditions: discovery.EndpointConditions{Ready: ptrTo(false), Serving: ptrTo(true)}},
					{Addresses: []string{"::ffff:10.0.0.4"}, Hints: &discovery.EndpointHints{}},
					{Addresses: []string{"bogus"}},
					{},
				}},
			&sliceRecord{recordMeta: recordMeta{"ns", "e", "7"}, service: "s", trigger: trigger,
				ports: []slicePortRecord{{"", v1.ProtocolTCP, 80}, {"d", v1.ProtocolUDP, 53}, {"none", v1.ProtocolTCP, 0}, {"big", v1.ProtocolTCP, 0}},
				endpoints: []sliceEndpoint{
					{addr: netip.MustParseAddr("10.0.0.1"), node: "n1", hints: &endpointHints{zones: []string{"z"}, nodes: []string{"n1"}}, ready: true, serving: true},
					{addr: netip.MustParseAddr("10.0.0.2"), serving: true, terminating: true}, // kube-proxy: absent serving is true
					{addr: netip.MustParseAddr("10.0.0.3"), serving: true},
					{addr: netip.MustParseAddr("10.0.0.4"), ready: true, serving: true},
				}}},
		{"an FQDN slice has no endpoints; a malformed trigger time is none",
			&discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "f",
				Annotations: map[string]string{v1.EndpointsLastChangeTriggerTime: "yesterday"}},
				AddressType: discovery.AddressTypeFQDN, Endpoints: []discovery.Endpoint{{Addresses: []string{"example.com"}}}},
			&sliceRecord{recordMeta: recordMeta{"ns", "f", ""}}},
		{"a Node passes untouched",
			&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", ManagedFields: managed}},
			&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", ManagedFields: managed}}},
		{"a record passes untouched (transforms must be idempotent)", rec, rec},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := toRecord(c.in)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(c.want, got, cmp.AllowUnexported(serviceRecord{}, sliceRecord{}, recordMeta{}, slicePortRecord{}, sliceEndpoint{}, endpointHints{}),
				cmpopts.EquateEmpty(), cmpopts.EquateComparable(netip.Addr{})); diff != "" {
				t.Errorf("record (-want +got):\n%s", diff)
			}
		})
	}
}

// TestRecordInformersDeliverEveryChange: the views hold records, keyed
// as the objects were, and an update reaches the handlers because the
// record keeps the resourceVersion (an unchanged one means a resync).
func TestRecordInformersDeliverEveryChange(t *testing.T) {
	ctx := t.Context()
	slice := func(rv, ip string) *discovery.EndpointSlice {
		return &discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "e", ResourceVersion: rv,
			Labels: map[string]string{discovery.LabelServiceName: "s"}}, AddressType: discovery.AddressTypeIPv4,
			Endpoints: []discovery.Endpoint{{Addresses: []string{ip}}}}
	}
	client := fake.NewClientset(&v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s", ResourceVersion: "1"}}, slice("1", "10.0.0.1"))
	// The fake's watch sees only changes made after it started: the
	// changes wait for it.
	watching := make(chan struct{}, 1)
	client.PrependWatchReactor("endpointslices", func(a k8stesting.Action) (bool, apiwatch.Interface, error) {
		w, err := client.Tracker().Watch(a.GetResource(), a.GetNamespace())
		select {
		case watching <- struct{}{}:
		default:
		}
		return true, w, err
	})
	f := informer.New(client)
	v := registerViews(f, "node-a", false)
	f.Start(ctx)
	if !cache.WaitFor(ctx, "", v.services.Synced(), v.slices.Synced()) {
		t.Fatal("the views did not sync")
	}
	inf := v.slices
	seen := make(chan string, 10)
	note := func(obj any) {
		if s, ok := obj.(*sliceRecord); ok && len(s.endpoints) == 1 {
			seen <- s.endpoints[0].addr.String()
		} else {
			seen <- fmt.Sprintf("%T", obj)
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: note, UpdateFunc: func(_, o any) { note(o) }, DeleteFunc: note}); err != nil {
		t.Fatal(err)
	}
	if o, ok, err := v.services.Indexer().GetByKey("ns/s"); !ok || err != nil {
		t.Errorf("Service ns/s not in the store: %v", err)
	} else if _, ok := o.(*serviceRecord); !ok {
		t.Errorf("the Service store holds a %T, want a *serviceRecord", o)
	}
	<-watching
	if _, err := client.DiscoveryV1().EndpointSlices("ns").Update(ctx, slice("2", "10.0.0.2"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := client.DiscoveryV1().EndpointSlices("ns").Delete(ctx, "e", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var got []string
	for len(got) < 3 {
		select {
		case s := <-seen:
			got = append(got, s)
		case <-time.After(10 * time.Second):
			t.Fatalf("events so far %v; want an add, an update and a delete", got)
		}
	}
	if want := []string{"10.0.0.1", "10.0.0.2", "10.0.0.2"}; !slices.Equal(got, want) {
		t.Errorf("events %v, want %v", got, want)
	}
	if keys := inf.Indexer().ListKeys(); len(keys) != 0 {
		t.Errorf("store keys after the delete: %v", keys)
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
	f := informer.New(client)
	v := registerViews(f, "node-a", false)
	f.Start(t.Context())
	if !cache.WaitFor(t.Context(), "", v.services.Synced(), v.slices.Synced()) {
		t.Fatal("the views did not sync")
	}
	var names []string
	for _, k := range v.services.Indexer().ListKeys() {
		names = append(names, "service "+k)
	}
	for _, k := range v.slices.Indexer().ListKeys() {
		names = append(names, "slice "+k)
	}
	slices.Sort(names)
	if want := []string{"service ns/mine", "slice ns/mine-1"}; !slices.Equal(names, want) {
		t.Errorf("the proxy's informers hold %v, want %v", names, want)
	}
}

func ptrTo[T any](v T) *T { return &v }
