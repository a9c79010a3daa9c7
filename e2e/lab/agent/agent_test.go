package agent

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func testWorker() *podWorker {
	a := New(Config{NodeName: "node-1", NodeIPs: []string{"172.30.0.11", "fd00:172:30::11"},
		ClusterDNS: "10.96.0.10", ClusterDomain: "cluster.local", UpstreamDNS: "172.30.0.53"}, nil, nil)
	return newPodWorker(a, "uid-1", "shop", "web")
}

func TestResolvConfIsWhatTheKubeletWrites(t *testing.T) {
	w := testWorker()
	cases := []struct {
		name string
		spec corev1.PodSpec
		want *cri.DNSConfig
	}{
		{"ClusterFirst by default", corev1.PodSpec{}, &cri.DNSConfig{Servers: []string{"10.96.0.10"},
			Searches: []string{"shop.svc.cluster.local", "svc.cluster.local", "cluster.local"}, Options: []string{"ndots:5"}}},
		{"hostNetwork falls back to Default", corev1.PodSpec{HostNetwork: true}, &cri.DNSConfig{Servers: []string{"172.30.0.53"}}},
		{"ClusterFirstWithHostNet", corev1.PodSpec{HostNetwork: true, DNSPolicy: corev1.DNSClusterFirstWithHostNet}, &cri.DNSConfig{Servers: []string{"10.96.0.10"},
			Searches: []string{"shop.svc.cluster.local", "svc.cluster.local", "cluster.local"}, Options: []string{"ndots:5"}}},
		{"None takes dnsConfig", corev1.PodSpec{DNSPolicy: corev1.DNSNone, DNSConfig: &corev1.PodDNSConfig{Nameservers: []string{"192.0.2.1"}, Searches: []string{"example"}}},
			&cri.DNSConfig{Servers: []string{"192.0.2.1"}, Searches: []string{"example"}}},
	}
	for _, c := range cases {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web"}, Spec: c.spec}
		if got := w.dnsConfig(pod); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, got, c.want)
		}
	}
}

func TestPodIsReadyOnlyWhenRunningAndEveryContainerIsReady(t *testing.T) {
	w := testWorker()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "a"}, {Name: "b"}}}}
	ready := func(s corev1.PodStatus) corev1.ConditionStatus {
		for _, c := range s.Conditions {
			if c.Type == corev1.PodReady {
				return c.Status
			}
		}
		return ""
	}
	if s := w.status(pod, nil); s.Phase != corev1.PodPending || ready(s) != corev1.ConditionFalse || s.PodIP != "" {
		t.Errorf("without a sandbox: phase %s ready %s ip %q, want Pending, False, none", s.Phase, ready(s), s.PodIP)
	}
	w.containers["a"] = &containerState{id: "1", ready: true}
	w.containers["b"] = &containerState{id: "2", ready: false}
	ips := []string{"10.244.1.5", "fd00:10:244:1::5"}
	s := w.status(pod, ips)
	if s.Phase != corev1.PodRunning || ready(s) != corev1.ConditionFalse || len(s.PodIPs) != 2 || s.PodIP != ips[0] {
		t.Errorf("one container not ready: phase %s ready %s ips %v, want Running, False, both", s.Phase, ready(s), s.PodIPs)
	}
	w.containers["b"].ready = true
	if s := w.status(pod, ips); ready(s) != corev1.ConditionTrue {
		t.Errorf("all ready: Ready=%s, want True", ready(s))
	}
	if s.HostIP != "172.30.0.11" || len(s.HostIPs) != 2 {
		t.Errorf("host IPs %v, want the node's two InternalIPs", s.HostIPs)
	}
}
