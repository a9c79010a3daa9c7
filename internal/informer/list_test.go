package informer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
)

// fakePages serves pods in pages of two, recording each request.
type fakePages struct {
	pods []*corev1.Pod
	asks []metav1.ListOptions
	fail bool
}

func (f *fakePages) list(_ context.Context, o metav1.ListOptions) (runtime.Object, error) {
	f.asks = append(f.asks, o)
	if f.fail && o.Continue != "" {
		return nil, errors.New("the continue token expired")
	}
	start := 0
	if o.Continue != "" {
		fmt.Sscan(o.Continue, &start)
	}
	l := &corev1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: "42"}}
	for _, p := range f.pods[start:min(start+2, len(f.pods))] {
		l.Items = append(l.Items, *p)
	}
	if start+2 < len(f.pods) {
		l.Continue = fmt.Sprint(start + 2)
	}
	return l, nil
}

func testPod(name string, phase corev1.PodPhase, ips ...string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}, Status: corev1.PodStatus{Phase: phase}}
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	return p
}

// keepPod keeps the name of a pod with an address, and nothing of others.
func keepPod(obj runtime.Object) any {
	if p := obj.(*corev1.Pod); len(p.Status.PodIPs) > 0 {
		return p.Name
	}
	return nil
}

func TestPagedListKeepsOnlyWhatItIsAskedToFromEveryPage(t *testing.T) {
	f := &fakePages{pods: []*corev1.Pod{
		testPod("a", corev1.PodRunning, "10.0.0.1"), testPod("b", corev1.PodPending),
		testPod("c", corev1.PodRunning, "10.0.0.3"), testPod("d", corev1.PodRunning, "10.0.0.4"),
		testPod("e", corev1.PodRunning, "10.0.0.5"),
	}}
	l, err := pagedList(context.Background(), metav1.ListOptions{ResourceVersion: "0", FieldSelector: "x"}, f.list, keepPod)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, o := range l.Items {
		names = append(names, o.(*listed).rec.(string))
	}
	if want := []string{"a", "c", "d", "e"}; !slices.Equal(names, want) {
		t.Errorf("kept %v, want %v (every page, and no pod without an address)", names, want)
	}
	if l.ResourceVersion != "42" {
		t.Errorf("list version %q, want the API server's 42", l.ResourceVersion)
	}
	for i, o := range f.asks {
		if o.Limit != listPageSize || o.ResourceVersion != "" || o.FieldSelector != "x" {
			t.Errorf("request %d: %+v; want a page of %d of the current state, with the caller's selector", i, o, listPageSize)
		}
	}
	if len(f.asks) != 3 {
		t.Errorf("%d requests for 5 pods in pages of 2, want 3", len(f.asks))
	}
}

func TestPagedListFailsWholeWhenAPageFails(t *testing.T) {
	f := &fakePages{pods: []*corev1.Pod{testPod("a", corev1.PodRunning, "10.0.0.1"), testPod("b", corev1.PodRunning, "10.0.0.2"),
		testPod("c", corev1.PodRunning, "10.0.0.3")}, fail: true}
	if l, err := pagedList(context.Background(), metav1.ListOptions{}, f.list, keepPod); err == nil {
		t.Errorf("a failed second page gave a list of %d; want the error, so the reflector lists again", len(l.Items))
	}
}

func TestASinksStoreIsSyncedOnceTheFirstListIsHandedOn(t *testing.T) {
	h := New(fake.NewClientset()).Register(View{Kind: Pods, Name: "dns", Sink: &addrSink{}})
	s := newSinkStore(h)
	_ = s.Add(testPod("a", corev1.PodRunning, "10.0.0.1"))
	select {
	case <-s.Done():
		t.Error("done before the first list")
	default:
	}
	_ = s.Replace(nil, "")
	_ = s.Replace(nil, "") // a relist: done stays done
	select {
	case <-s.Done():
	default:
		t.Error("not done after the first list")
	}
}

func TestPagedListHoldsRecordsThatAreObjectsAsTheyAre(t *testing.T) {
	f := &fakePages{pods: []*corev1.Pod{testPod("a", corev1.PodRunning, "10.0.0.1"), testPod("b", corev1.PodRunning, "10.0.0.2")}}
	l, err := pagedList(context.Background(), metav1.ListOptions{}, f.list, func(o runtime.Object) any { return o })
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range l.Items {
		if _, ok := o.(*corev1.Pod); !ok {
			t.Errorf("the list holds a %T, want the *v1.Pod the record is", o)
		}
	}
}
