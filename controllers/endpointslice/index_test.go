package endpointslice

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	esutil "k8s.io/endpointslice/util"
)

// TestSelectPodsMatchesTheLister: the label index finds exactly the pods
// a namespace scan finds, for selectors of one and several labels, empty
// selectors and values no pod has, in two namespaces, also after pods were
// relabelled and deleted.
func TestSelectPodsMatchesTheLister(t *testing.T) {
	f := informers.NewSharedInformerFactory(fake.NewClientset(), 0)
	inf := f.Core().V1().Pods().Informer()
	if err := addIndex(inf, podLabelIndex, podLabelKeys); err != nil {
		t.Fatal(err)
	}
	if err := addIndex(inf, podLabelIndex, podLabelKeys); err != nil { // a second controller on the same factory
		t.Fatal(err)
	}
	idx := inf.GetIndexer()
	lister := f.Core().V1().Pods().Lister()
	rng := rand.New(rand.NewPCG(3, 4))
	label := func() map[string]string {
		l := map[string]string{}
		for _, k := range []string{"app", "tier", "zone"} {
			if rng.IntN(4) > 0 {
				l[k] = fmt.Sprint(rng.IntN(3))
			}
		}
		return l
	}
	var pods []*corev1.Pod
	for i := range 300 {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: []string{"a", "b"}[i%2], Name: fmt.Sprint("p", i), Labels: label()}}
		pods = append(pods, p)
		if err := idx.Add(p); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range pods[:50] {
		q := p.DeepCopy()
		q.Labels = label()
		if err := idx.Update(q); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range pods[50:80] {
		if err := idx.Delete(p); err != nil {
			t.Fatal(err)
		}
	}
	names := func(ps []*corev1.Pod) []string {
		var out []string
		for _, p := range ps {
			out = append(out, p.Name)
		}
		slices.Sort(out)
		return out
	}
	for range 200 {
		sel := label()
		if rng.IntN(10) == 0 {
			sel["app"] = "nobody"
		}
		for _, ns := range []string{"a", "b", "c"} {
			want, err := lister.Pods(ns).List(labels.Set(sel).AsSelectorPreValidated())
			if err != nil {
				t.Fatal(err)
			}
			got, err := selectPods(idx, lister.Pods(ns).List, ns, sel)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(names(got), names(want)) {
				t.Fatalf("selector %v in %s: got %v, want %v", sel, ns, names(got), names(want))
			}
		}
	}
}

// BenchmarkSelectPods compares finding a 25-pod Service's pods by a
// namespace scan (PodLister.List, kube-controller-manager's way) and by the
// label index, in one namespace of 11,000 and 55,000 pods (the medium and
// the full benchmark scale).
func BenchmarkSelectPods(b *testing.B) {
	for _, n := range []int{11000, 55000} {
		f := informers.NewSharedInformerFactory(fake.NewClientset(), 0)
		inf := f.Core().V1().Pods().Informer()
		if err := addIndex(inf, podLabelIndex, podLabelKeys); err != nil {
			b.Fatal(err)
		}
		for i := range n {
			p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: fmt.Sprint("p", i),
				Labels: map[string]string{"app": fmt.Sprint("s", i%(n/25))}}}
			if err := inf.GetIndexer().Add(p); err != nil {
				b.Fatal(err)
			}
		}
		lister := f.Core().V1().Pods().Lister().Pods("bench")
		sel := map[string]string{"app": "s7"}
		b.Run(fmt.Sprintf("pods=%d/scan", n), func(b *testing.B) {
			for b.Loop() {
				if _, err := lister.List(labels.Set(sel).AsSelectorPreValidated()); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("pods=%d/index", n), func(b *testing.B) {
			for b.Loop() {
				if _, err := selectPods(inf.GetIndexer(), lister.List, "bench", sel); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestServicesToUpdateMatchesTheLibrary: the selector index finds exactly
// the Services esutil.GetServicesToUpdate finds by scanning the namespace,
// for Services of one and two labels, an empty selector (every pod) and
// none (no pod), in two namespaces, for pods whose labels did not change,
// changed alone, or changed with their endpoint; also after Services were
// reselected and deleted.
func TestServicesToUpdateMatchesTheLibrary(t *testing.T) {
	f := informers.NewSharedInformerFactory(fake.NewClientset(), 0)
	inf := f.Core().V1().Services().Informer()
	if err := addIndex(inf, serviceSelectorIndex, serviceSelectorKeys); err != nil {
		t.Fatal(err)
	}
	idx, lister := inf.GetIndexer(), f.Core().V1().Services().Lister()
	rng := rand.New(rand.NewPCG(5, 6))
	label := func(keys ...string) map[string]string {
		l := map[string]string{}
		for _, k := range keys {
			if rng.IntN(3) > 0 {
				l[k] = fmt.Sprint(rng.IntN(3))
			}
		}
		return l
	}
	selector := func() map[string]string {
		switch rng.IntN(10) {
		case 0:
			return nil
		case 1:
			return map[string]string{}
		}
		if s := label("app", "tier"); len(s) > 0 {
			return s
		}
		return map[string]string{"app": "0"}
	}
	var services []*corev1.Service
	for i := range 120 {
		s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: []string{"a", "b"}[i%2], Name: fmt.Sprint("s", i)},
			Spec: corev1.ServiceSpec{Selector: selector()}}
		services = append(services, s)
		if err := idx.Add(s); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range services[:20] {
		u := s.DeepCopy()
		u.Spec.Selector = selector()
		if err := idx.Update(u); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range services[20:30] {
		if err := idx.Delete(s); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 500 {
		key := &esutil.PodProjectionKey{Namespace: []string{"a", "b", "c"}[i%3], Labels: label("app", "tier", "zone")}
		if i%2 == 1 {
			key.OldLabels, key.PodChanged = label("app", "tier", "zone"), i%4 == 1
		}
		want, err := esutil.GetServicesToUpdate(lister, key)
		if err != nil {
			t.Fatal(err)
		}
		got, err := servicesToUpdate(idx, key)
		if err != nil {
			t.Fatal(err)
		}
		if !got.Equal(want) {
			t.Fatalf("pod change %+v: got %v, want %v", *key, sets.List(got), sets.List(want))
		}
	}
}
