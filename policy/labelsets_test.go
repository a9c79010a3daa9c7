package policy

import (
	"reflect"
	"runtime"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestPodsWithEqualLabelsShareOneMap(t *testing.T) {
	pod := func(name string, labels map[string]string) *Pod {
		return PodFromAPI(&v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: labels}})
	}
	mapOf := func(p *Pod) uintptr { return reflect.ValueOf(p.Labels).Pointer() }
	a := pod("a", map[string]string{"app": "web", "tier": "fe"})
	b := pod("b", map[string]string{"tier": "fe", "app": "web"})
	c := pod("c", map[string]string{"app": "web", "tier": "be"})
	d := pod("d", map[string]string{"app": "web\x00tier", "": "fe"}) // no collision through the separators
	if mapOf(a) != mapOf(b) {
		t.Error("pods with equal labels hold two maps")
	}
	if mapOf(a) == mapOf(c) || mapOf(a) == mapOf(d) {
		t.Error("pods with different labels share a map")
	}
	if !reflect.DeepEqual(c.Labels, map[string]string{"app": "web", "tier": "be"}) {
		t.Errorf("labels %v", c.Labels)
	}
	if p := pod("e", nil); p.Labels != nil {
		t.Errorf("a pod without labels got %v", p.Labels)
	}

	// Once no record holds a set, the table lets it go.
	key := labelsKey(map[string]string{"app": "gone"})
	e := pod("e", map[string]string{"app": "gone"})
	runtime.KeepAlive(e)
	e = nil
	for range 20 {
		runtime.GC()
		labelSets.Lock()
		_, held := labelSets.byKey[key]
		labelSets.Unlock()
		if !held {
			return
		}
		runtime.Gosched()
	}
	t.Error("the table still holds a label set no pod holds")
}
