// Package apitest is what the controllers' tests against a real
// kube-apiserver share: a client config that counts the slice writes
// leaving it, the objects the tests create (one namespace per test) and
// the wait for a Service's endpoints. The role's tests (package
// controllers) and the selector controller's (package endpointslice) both
// use it.
package apitest

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/netplane/netplane/e2e/framework"
)

// WriteCounter counts EndpointSlice writes per namespace and verb as they
// leave a client, whether or not the API server accepts them.
type WriteCounter struct {
	mu     sync.Mutex
	counts map[string]*[3]int // namespace → creates, updates, deletes
}

func (w *WriteCounter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		ns, ok := sliceNamespace(r.URL.Path)
		verb := map[string]int{http.MethodPost: 0, http.MethodPut: 1, http.MethodPatch: 1, http.MethodDelete: 2}
		if i, write := verb[r.Method]; ok && write {
			w.mu.Lock()
			if w.counts[ns] == nil {
				w.counts[ns] = &[3]int{}
			}
			w.counts[ns][i]++
			w.mu.Unlock()
		}
		return rt.RoundTrip(r)
	})
}

// Get returns the creates, updates and deletes sent in namespace ns.
func (w *WriteCounter) Get(ns string) [3]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if c := w.counts[ns]; c != nil {
		return *c
	}
	return [3]int{}
}

// Total is the number of slice writes sent in all namespaces.
func (w *WriteCounter) Total() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, c := range w.counts {
		n += c[0] + c[1] + c[2]
	}
	return n
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// sliceNamespace parses /apis/discovery.k8s.io/v1/namespaces/NS/endpointslices[/name].
func sliceNamespace(path string) (string, bool) {
	rest, ok := strings.CutPrefix(path, "/apis/discovery.k8s.io/v1/namespaces/")
	if !ok {
		return "", false
	}
	ns, kind, _ := strings.Cut(rest, "/")
	return ns, strings.HasPrefix(kind, "endpointslices")
}

// CountingConfig is cfg with its slice writes counted in a new counter.
func CountingConfig(cfg *rest.Config) (*rest.Config, *WriteCounter) {
	w := &WriteCounter{counts: map[string]*[3]int{}}
	c := rest.CopyConfig(cfg)
	c.Wrap(w.wrap)
	c.QPS, c.Burst = 100, 200
	c.WarningHandler = rest.NoWarnings{}
	return c, w
}

// ServiceOpt changes a Service that Service builds.
type ServiceOpt func(*corev1.Service)

// Service is a ClusterIP Service in namespace "ns" selecting app=name,
// port http 80 to 8080.
func Service(name string, opts ...ServiceOpt) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID(name + "-uid"),
			CreationTimestamp: metav1.Now()},
		Spec: corev1.ServiceSpec{
			Selector:   map[string]string{"app": name},
			ClusterIP:  "10.96.0.10",
			ClusterIPs: []string{"10.96.0.10"},
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
			Ports:      []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}},
		},
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

// PodOpt changes a Pod that Pod builds.
type PodOpt func(*corev1.Pod)

// Pod is pod i of the app label app in namespace "ns", ready, on node-1,
// with IPv4 10.0.x.y and IPv6 fd00::x:y.
func Pod(app string, i int, opts ...PodOpt) *corev1.Pod {
	v4 := fmt.Sprintf("10.0.%d.%d", i/250, i%250+1)
	v6 := netip.MustParseAddr(fmt.Sprintf("fd00::%x:%x", i/250, i%250+1)).String()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", app, i), Namespace: "ns",
			UID: types.UID(fmt.Sprintf("%s-%d-uid", app, i)), Labels: map[string]string{"app": app}, ResourceVersion: "1"},
		Spec: corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "c",
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: v4,
			PodIPs:     []corev1.PodIP{{IP: v4}, {IP: v6}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

// Node is a Node with an optional zone label.
func Node(name, zone string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}}}
	if zone != "" {
		n.Labels[corev1.LabelTopologyZone] = zone
	}
	return n
}

// NewNamespace creates a namespace for one test.
func NewNamespace(t *testing.T, s *framework.APIServer, prefix string) string {
	t.Helper()
	ns, err := s.Client.CoreV1().Namespaces().Create(framework.Ctx(t), &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// CreateNode makes the Node name with an optional zone label, deleted
// when the test ends.
func CreateNode(t *testing.T, s *framework.APIServer, name, zone string) {
	t.Helper()
	if _, err := s.Client.CoreV1().Nodes().Create(framework.Ctx(t), Node(name, zone), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Client.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
}

// CreatePod creates p in ns and sets its status (IPs, phase, Ready) as a
// kubelet would.
func CreatePod(t *testing.T, client kubernetes.Interface, ns string, p *corev1.Pod) *corev1.Pod {
	t.Helper()
	p = p.DeepCopy()
	p.Namespace, p.UID, p.ResourceVersion = ns, "", ""
	p.Spec.Containers[0].Image = "pause"
	for i := range p.Spec.InitContainers {
		p.Spec.InitContainers[i].Image = "pause"
	}
	deleting := p.DeletionTimestamp != nil
	p.DeletionTimestamp = nil
	got, err := framework.CreatePod(framework.Ctx(t), client, p)
	if err != nil {
		t.Fatal(err)
	}
	if deleting {
		// A pod bound to a node stays terminating until its kubelet (absent
		// here) confirms, so a long grace period keeps it terminating.
		err := client.CoreV1().Pods(ns).Delete(framework.Ctx(t), got.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64(3600))})
		if err != nil {
			t.Fatal(err)
		}
	}
	return got
}

// CreateService creates svc in ns, leaving the cluster IPs to the API
// server.
func CreateService(t *testing.T, client kubernetes.Interface, ns string, svc *corev1.Service) *corev1.Service {
	t.Helper()
	svc = svc.DeepCopy()
	svc.Namespace, svc.UID, svc.CreationTimestamp = ns, "", metav1.Time{}
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		svc.Spec.IPFamilies, svc.Spec.ClusterIP, svc.Spec.ClusterIPs = nil, "", nil
	} else if svc.Spec.ClusterIP != corev1.ClusterIPNone {
		svc.Spec.ClusterIP, svc.Spec.ClusterIPs = "", nil
	} else {
		svc.Spec.ClusterIPs = []string{corev1.ClusterIPNone}
	}
	if len(svc.Spec.IPFamilies) > 1 {
		svc.Spec.IPFamilyPolicy = new(corev1.IPFamilyPolicyRequireDualStack)
	}
	if len(svc.Spec.Ports) == 0 && svc.Spec.ClusterIP != corev1.ClusterIPNone {
		svc.Spec.Ports = []corev1.ServicePort{{Port: 80}}
	}
	got, err := client.CoreV1().Services(ns).Create(framework.Ctx(t), svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// ListOwn lists the slices of Service name that managedBy manages.
func ListOwn(t *testing.T, client kubernetes.Interface, ns, name, managedBy string) []*discovery.EndpointSlice {
	t.Helper()
	list, err := client.DiscoveryV1().EndpointSlices(ns).List(framework.Ctx(t), metav1.ListOptions{
		LabelSelector: discovery.LabelServiceName + "=" + name + "," + discovery.LabelManagedBy + "=" + managedBy})
	if err != nil {
		t.Fatal(err)
	}
	var out []*discovery.EndpointSlice
	for i := range list.Items {
		out = append(out, &list.Items[i])
	}
	return out
}

// WaitEndpoints waits until the slices managedBy manages for svc list
// exactly the want pods, each once.
func WaitEndpoints(t *testing.T, s *framework.APIServer, ns, svc, managedBy string, want int) {
	t.Helper()
	framework.Eventually(t, 30*time.Second, "endpoints of "+svc, func() error {
		names, dups := EndpointNames(ListOwn(t, s.Client, ns, svc, managedBy))
		if !(names.Len() == want && dups == 0) {
			return fmt.Errorf("%d endpoints, %d duplicated, want %d", names.Len(), dups, want)
		}
		return nil
	})
}

// EndpointNames are the target names of the endpoints of ss, and how many
// endpoints named a target already seen.
func EndpointNames(ss []*discovery.EndpointSlice) (sets.Set[string], int) {
	names, dups := sets.New[string](), 0
	for _, s := range ss {
		for _, e := range s.Endpoints {
			if names.Has(e.TargetRef.Name) {
				dups++
			}
			names.Insert(e.TargetRef.Name)
		}
	}
	return names, dups
}
