package endpointslice

import (
	"fmt"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	esrec "k8s.io/endpointslice"
	esutil "k8s.io/endpointslice/util"
)

// BenchmarkPlanSteadyState measures the library reconciler's cost of one
// sync of a Service whose slices are already correct (no write): the CPU a
// resync or an irrelevant event costs. It decided building on the library.
func BenchmarkPlanSteadyState(b *testing.B) {
	for _, n := range []int{25, 1000, 5000} {
		b.Run(fmt.Sprintf("pods=%d", n), func(b *testing.B) {
			svc, pods, client, r, slices := plannedService(b, n, nil)
			b.ResetTimer()
			for b.Loop() {
				if err := r.Reconcile(logrDiscard(), svc, pods, slices, metav1.Now().Time); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			if a := client.Actions(); len(a) != 0 {
				b.Fatalf("steady state wrote %d times", len(a))
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/endpoint")
		})
	}
}

func benchObjects(n int) (*corev1.Service, []*corev1.Pod, []*corev1.Node) {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "svc", Namespace: "ns", UID: "svc-uid"},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "a"}, ClusterIP: "10.96.0.10", IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstrFromInt(8080), Protocol: corev1.ProtocolTCP}},
		},
	}
	nodes := []*corev1.Node{{ObjectMeta: metav1.ObjectMeta{Name: "node-0", Labels: map[string]string{corev1.LabelTopologyZone: "z0"}}}}
	var pods []*corev1.Pod
	for i := range n {
		pods = append(pods, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%d", i), Namespace: "ns", UID: types.UID(fmt.Sprintf("uid-%d", i)), Labels: map[string]string{"app": "a"}},
			Spec:       corev1.PodSpec{NodeName: "node-0"},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255),
				PodIPs:     []corev1.PodIP{{IP: fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)}},
				Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
		})
	}
	return svc, pods, nodes
}

// BenchmarkPlanOneFlip measures one sync's planning after one pod of the
// Service turned not ready, planning everything and narrowed (narrow.go);
// the one update it writes is answered at once.
func BenchmarkPlanOneFlip(b *testing.B) {
	for _, n := range []int{25, 1000, 5000} {
		for _, narrowed := range []bool{false, true} {
			b.Run(fmt.Sprintf("pods=%d/narrowed=%v", n, narrowed), func(b *testing.B) {
				sp := newSplicer()
				svc, pods, client, r, existing := plannedService(b, n, sp)
				// Answered at once, so that the figure is the planning.
				client.PrependReactor("update", "endpointslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
					return true, a.(k8stesting.UpdateAction).GetObject(), nil
				})
				svc.ResourceVersion = "1"
				for _, p := range pods {
					p.ResourceVersion = "1"
				}
				last := recordSync(svc, 0, pods, existing)
				i := 0
				for b.Loop() {
					flipped := slices.Clone(pods)
					p := pods[i%n].DeepCopy()
					p.Status.Conditions[0].Status = corev1.ConditionFalse
					p.ResourceVersion = "2"
					flipped[i%n] = p
					i++
					planPods, planSlices := flipped, existing
					var nw struct {
						pods   []*corev1.Pod
						slices []*discovery.EndpointSlice
						cuts   map[string]cut
					}
					if narrowed {
						n, ok := narrow(last, svc, 0, flipped, existing, func(*discovery.EndpointSlice) bool { return false })
						if !ok || len(n.slices) != 1 {
							b.Fatalf("narrowed %v to %d slices", ok, len(n.slices))
						}
						nw.pods, nw.slices, nw.cuts = n.pods, n.slices, n.cuts
						planPods, planSlices = nw.pods, nw.slices
						sp.begin(svc.Namespace, svc.Name, nw.cuts)
					}
					err := r.Reconcile(logrDiscard(), svc, planPods, planSlices, metav1.Now().Time)
					if err != nil || sp.end(svc.Namespace, svc.Name, nw.cuts) {
						b.Fatalf("narrowed %v: %v", narrowed, err)
					}
					if u := client.Actions(); len(u) != 1 || len(u[0].(k8stesting.UpdateAction).GetObject().(*discovery.EndpointSlice).Endpoints) != min(n, 100) {
						b.Fatalf("%d writes, want one update of a whole slice", len(u))
					}
					client.ClearActions()
				}
			})
		}
	}
}

// plannedService is a Service of n pods whose slices the returned
// reconciler created, with the fake client's actions cleared. The
// reconciler writes through sp, when given.
func plannedService(b *testing.B, n int, sp *splicer) (*corev1.Service, []*corev1.Pod, *fake.Clientset, *esrec.Reconciler, []*discovery.EndpointSlice) {
	svc, pods, nodes := benchObjects(n)
	client := newFakeClient(func(string, *discovery.EndpointSlice) {})
	f := informers.NewSharedInformerFactory(client, 0)
	for _, nd := range nodes {
		f.Core().V1().Nodes().Informer().GetIndexer().Add(nd)
	}
	var w kubernetes.Interface = client
	if sp != nil {
		w = splicingClient{client, sp}
	}
	r := esrec.NewReconciler(w, f.Core().V1().Nodes().Lister(), 100, esutil.NewEndpointSliceTracker(), nil, record.NewFakeRecorder(100), ControllerName)
	if err := r.Reconcile(logrDiscard(), svc, pods, nil, metav1.Now().Time); err != nil {
		b.Fatal(err)
	}
	var existing []*discovery.EndpointSlice
	list, _ := client.DiscoveryV1().EndpointSlices("ns").List(b.Context(), metav1.ListOptions{})
	for i := range list.Items {
		existing = append(existing, &list.Items[i])
	}
	client.ClearActions()
	return svc, pods, client, r, existing
}
