package relay

import (
	"reflect"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/netplane/netplane/policy"
)

// TestADigestIsAllANodeReadsOfAPod: the node role's record of a pod is the
// same whether it read the whole pod or the relay's digest of it. A field
// the node role comes to read must enter the digest.
func TestADigestIsAllANodeReadsOfAPod(t *testing.T) {
	rich := func() *v1.Pod {
		return &v1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web-0", ResourceVersion: "7", UID: "u", Generation: 3,
				Labels: map[string]string{"app": "web", "tier": "fe"}, Annotations: map[string]string{"a": "b"},
				DeletionTimestamp: &metav1.Time{}, OwnerReferences: []metav1.OwnerReference{{Name: "rs"}}},
			Spec: v1.PodSpec{NodeName: "n1", ServiceAccountName: "sa",
				Containers: []v1.Container{
					{Name: "app", Image: "img", Ports: []v1.ContainerPort{{Name: "http", ContainerPort: 8080}, {ContainerPort: 9090}, {Name: "dns", ContainerPort: 53, Protocol: v1.ProtocolUDP}}},
					{Name: "side", Ports: []v1.ContainerPort{{Name: "metrics", ContainerPort: 9100, Protocol: v1.ProtocolSCTP}}},
				},
				InitContainers: []v1.Container{
					{Name: "proxy", RestartPolicy: ptr.To(v1.ContainerRestartPolicyAlways), Ports: []v1.ContainerPort{{Name: "admin", ContainerPort: 15000}}},
					{Name: "setup", Ports: []v1.ContainerPort{{Name: "never", ContainerPort: 1}}},
				}},
			Status: v1.PodStatus{Phase: v1.PodRunning, PodIP: "10.1.0.5", PodIPs: []v1.PodIP{{IP: "10.1.0.5"}, {IP: "fd00::5"}}, HostIP: "192.0.2.1",
				Conditions: []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionTrue}}, ContainerStatuses: []v1.ContainerStatus{{Name: "app", Ready: true}}},
		}
	}
	for _, tc := range []struct {
		name   string
		change func(*v1.Pod)
	}{
		{"running, two families, named ports and a sidecar", func(*v1.Pod) {}},
		{"host network", func(p *v1.Pod) { p.Spec.HostNetwork = true }},
		{"succeeded", func(p *v1.Pod) { p.Status.Phase = v1.PodSucceeded }},
		{"failed", func(p *v1.Pod) { p.Status.Phase = v1.PodFailed }},
		{"pending, no address yet", func(p *v1.Pod) { p.Status = v1.PodStatus{Phase: v1.PodPending} }},
		{"only the old podIP field", func(p *v1.Pod) { p.Status.PodIPs = nil }},
		{"no labels, no ports", func(p *v1.Pod) { p.Labels, p.Spec.Containers, p.Spec.InitContainers = nil, nil, nil }},
		{"unscheduled", func(p *v1.Pod) { p.Spec.NodeName = "" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := rich()
			tc.change(p)
			whole, digest := policy.PodFromAPI(p), policy.PodFromAPI(Digest(p))
			if !reflect.DeepEqual(whole, digest) {
				t.Errorf("the node reads\n%+v\nof the pod, but\n%+v\nof its digest", whole, digest)
			}
		})
	}
}
