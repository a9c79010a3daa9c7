package policy

import (
	"reflect"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"

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
	key := labelsKey(map[string]string{"app": "gone"})
	letGo(t, labelSets, key, func() { runtime.KeepAlive(pod("e", map[string]string{"app": "gone"})) })
}

func TestPodsWithEqualNamedPortsShareOneList(t *testing.T) {
	pod := func(name string, ports ...v1.ContainerPort) *Pod {
		return PodFromAPI(&v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
			Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c", Ports: ports}}}})
	}
	http := v1.ContainerPort{Name: "http", ContainerPort: 8080}
	cases := []struct {
		name  string
		a, b  []v1.ContainerPort
		share bool
	}{
		{"equal", []v1.ContainerPort{http}, []v1.ContainerPort{http}, true},
		{"another port", []v1.ContainerPort{http}, []v1.ContainerPort{{Name: "http", ContainerPort: 8081}}, false},
		{"another protocol", []v1.ContainerPort{http}, []v1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: v1.ProtocolUDP}}, false},
		{"another name", []v1.ContainerPort{http}, []v1.ContainerPort{{Name: "web", ContainerPort: 8080}}, false},
		{"another order", []v1.ContainerPort{http, {Name: "dns", ContainerPort: 53}}, []v1.ContainerPort{{Name: "dns", ContainerPort: 53}, http}, false},
		{"no collision through the separator", []v1.ContainerPort{{Name: "a", ContainerPort: 1}}, []v1.ContainerPort{{Name: "a\x00", ContainerPort: 1}}, false},
	}
	for _, c := range cases {
		a, b := pod("a", c.a...), pod("b", c.b...)
		if shared := &a.Ports[0] == &b.Ports[0]; shared != c.share {
			t.Errorf("%s: shared %v, want %v (%v, %v)", c.name, shared, c.share, a.Ports, b.Ports)
		}
	}
	if p := pod("c"); p.Ports != nil {
		t.Errorf("a pod without named ports got %v", p.Ports)
	}
	key := portsKey([]NamedPort{{Name: "gone", Protocol: unix.IPPROTO_TCP, Port: 1}})
	letGo(t, portLists, key, func() { runtime.KeepAlive(pod("d", v1.ContainerPort{Name: "gone", ContainerPort: 1})) })
}

// letGo checks that once no record holds the value of key, which hold
// made and let go of, the table lets it go too.
func letGo[T any](t *testing.T, table *shareTable[T], key string, hold func()) {
	t.Helper()
	hold()
	table.mu.Lock()
	_, made := table.byKey[key]
	table.mu.Unlock()
	if !made {
		t.Fatal("the table never held the value")
	}
	for range 20 {
		runtime.GC()
		table.mu.Lock()
		_, held := table.byKey[key]
		table.mu.Unlock()
		if !held {
			return
		}
		runtime.Gosched()
	}
	t.Error("the table still holds a value no pod holds")
}
