package endpointslice

//lint:file-ignore SA1019 mirroring reads the Endpoints API, deprecated since v1.33, by design: it exists for users who still write Endpoints.

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/netplane/netplane/e2e/framework"
)

// TestSameSlicesAsKubeControllerManager gives two fresh API servers the
// same Services, Pods, Nodes and Endpoints; kube-controller-manager's
// endpointslice and endpointslicemirroring controllers run against one,
// `netplane --role=controller` (bin/netplane, a process) against the other.
// The slices must be the same but for names, UIDs and timestamps.
func TestSameSlicesAsKubeControllerManager(t *testing.T) {
	if testing.Short() {
		t.Skip("needs kube-apiserver and kube-controller-manager")
	}
	kcm := framework.RequireBinary(t, "kube-controller-manager")
	ours := framework.StartAPIServer(t, framework.Options{})
	theirs := framework.StartAPIServer(t, framework.Options{})
	for _, s := range []*framework.APIServer{ours, theirs} {
		populate(t, s)
	}
	p, err := framework.StartProcess("kube-controller-manager", exec.Command(kcm,
		"--kubeconfig="+theirs.Kubeconfig,
		"--controllers=endpointslice,endpointslicemirroring",
		"--leader-elect=false", "--secure-port=0", "--use-service-account-credentials=false", "--v=1",
	), filepath.Join(theirs.Dir, "kube-controller-manager.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kube-controller-manager log tail:\n%s", p.Tail(20))
		}
		p.Stop(10 * time.Second)
	})
	startNetplane(t, ours, "netplane")

	var got, want []string
	same := func(n int) error {
		got, want = canonicalSlices(t, ours.Client), canonicalSlices(t, theirs.Client)
		if !slices.Equal(got, want) || len(want) != n {
			detail := fmt.Sprintf("netplane %d slices, kube-controller-manager %d, want %d", len(got), len(want), n)
			if len(got) == len(want) {
				detail += "\n" + firstDifference(got, want)
			}
			return errors.New(detail)
		}
		return nil
	}
	framework.Eventually(t, 90*time.Second, "the same slices", func() error { return same(12) })

	// And they stay so. A Service created now is a barrier: each controller
	// has passed it once it wrote that Service's placeholder slice, and by
	// then netplane has written none of the slices of before again.
	before := resourceVersions(t, ours.Client)
	for _, s := range []*framework.APIServer{ours, theirs} {
		createService(t, s.Client, "compare", newService("barrier"))
	}
	framework.Eventually(t, 30*time.Second, "both controllers' slice of the Service created after they agreed", func() error { return same(13) })
	after := resourceVersions(t, ours.Client)
	for name, rv := range before {
		if after[name] != rv {
			t.Errorf("netplane wrote slice %s again after converging (resourceVersion %s, then %q)", name, rv, after[name])
		}
	}
}

// resourceVersions maps the name of every slice of namespace compare to
// its resourceVersion.
func resourceVersions(t *testing.T, c kubernetes.Interface) map[string]string {
	t.Helper()
	list, err := c.DiscoveryV1().EndpointSlices("compare").List(framework.Ctx(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, s := range list.Items {
		out[s.Name] = s.ResourceVersion
	}
	return out
}

func firstDifference(got, want []string) string {
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			return fmt.Sprintf("netplane:                %.3000s\nkube-controller-manager: %.3000s", got[i], want[i])
		}
	}
	return ""
}

// populate creates the comparison's objects: every kind of Service the
// controllers treat differently.
func populate(t *testing.T, s *framework.APIServer) {
	t.Helper()
	c := s.Client
	if _, err := c.CoreV1().Namespaces().Create(framework.Ctx(t), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "compare"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []*corev1.Node{newNode("node-1", "zone-a"), newNode("node-2", "zone-b"), newNode("node-3", "")} {
		if _, err := c.CoreV1().Nodes().Create(framework.Ctx(t), n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	spread := func(i int) podOpt { return onNode(fmt.Sprintf("node-%d", i%3+1)) }
	services := []struct {
		svc  *corev1.Service
		pods []*corev1.Pod
	}{
		{newService("web", namedPort("http"), func(s *corev1.Service) { s.Labels = map[string]string{"team": "x"} }),
			podsFor("web", 30, func(i int, p *corev1.Pod) {
				spread(i)(p)
				if i%10 == 3 {
					notReady(p)
				}
				if i%10 == 7 {
					terminating(p)
				}
				if i%6 == 0 {
					p.Spec.Containers[0].Ports[0].ContainerPort = 8081
				}
			})},
		{newService("pnra", func(s *corev1.Service) { s.Spec.PublishNotReadyAddresses = true }),
			podsFor("pnra", 4, func(i int, p *corev1.Pod) {
				if i == 1 {
					notReady(p)
				}
				if i == 2 {
					onNode("missing")(p)
				}
			})},
		{newService("headless", func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.Ports = corev1.ClusterIPNone, nil }),
			podsFor("headless", 3, func(i int, p *corev1.Pod) { p.Spec.Hostname, p.Spec.Subdomain = fmt.Sprintf("h%d", i), "headless" })},
		{newService("dual", dualStack), podsFor("dual", 5, func(i int, p *corev1.Pod) { spread(i)(p) })},
		{newService("close", withTrafficDistribution(corev1.ServiceTrafficDistributionPreferClose)),
			podsFor("close", 6, func(i int, p *corev1.Pod) {
				spread(i)(p)
				if i == 0 {
					notReady(p)
				}
			})},
		{newService("empty"), nil},
		{newService("ext", func(s *corev1.Service) {
			s.Spec.Type, s.Spec.ExternalName, s.Spec.Ports = corev1.ServiceTypeExternalName, "example.com", nil
		}),
			podsFor("ext", 2, nil)},
		{newService("big"), podsFor("big", 250, nil)},
		{newService("manual", func(s *corev1.Service) {
			s.Spec.Selector = nil
			s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt32(53)})
		}), nil},
	}
	for _, x := range services {
		createService(t, c, "compare", x.svc)
		for _, p := range x.pods {
			createPod(t, c, "compare", p)
		}
	}
	ep := &corev1.Endpoints{
		ObjectMeta: metav1.ObjectMeta{Name: "manual", Labels: map[string]string{"team": "y"},
			Annotations: map[string]string{"note": "copied", corev1.LastAppliedConfigAnnotation: "{}"}},
		Subsets: []corev1.EndpointSubset{
			{Addresses: []corev1.EndpointAddress{{IP: "192.0.2.1", Hostname: "a"}, {IP: "2001:db8::1"}},
				NotReadyAddresses: []corev1.EndpointAddress{{IP: "192.0.2.2"}},
				Ports:             []corev1.EndpointPort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}},
			{Addresses: []corev1.EndpointAddress{{IP: "192.0.2.3"}},
				Ports: []corev1.EndpointPort{{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP}}},
		},
	}
	if _, err := c.CoreV1().Endpoints("compare").Create(framework.Ctx(t), ep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func podsFor(app string, n int, change func(i int, p *corev1.Pod)) []*corev1.Pod {
	var out []*corev1.Pod
	for i := range n {
		p := newPod(app, i)
		if change != nil {
			change(i, p)
		}
		out = append(out, p)
	}
	return out
}

// canonicalSlices renders the slices of namespace compare as JSON, one
// line per group of slices that share metadata, family and ports, without
// what legitimately differs between two clusters: names, UIDs, resource
// versions, timestamps, the order of ports and endpoints, and which slice
// of a group an endpoint landed in (the library packs from a map). The
// group's slice sizes are kept.
func canonicalSlices(t *testing.T, c kubernetes.Interface) []string {
	t.Helper()
	list, err := c.DiscoveryV1().EndpointSlices("compare").List(framework.Ctx(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	type group struct {
		sizes     []int
		endpoints []string
	}
	groups := map[string]*group{}
	for _, s := range list.Items {
		key, eps := canonical(s)
		g := groups[key]
		if g == nil {
			g = &group{}
			groups[key] = g
		}
		g.sizes = append(g.sizes, len(eps))
		g.endpoints = append(g.endpoints, eps...)
	}
	var out []string
	for key, g := range groups {
		slices.Sort(g.sizes)
		slices.Sort(g.endpoints)
		out = append(out, fmt.Sprintf("%s sizes=%v endpoints=%s", key, g.sizes, strings.Join(g.endpoints, " ")))
	}
	slices.Sort(out)
	return out
}

// canonical returns a slice's identity without names and UIDs, and its
// endpoints without pod UIDs.
func canonical(s discovery.EndpointSlice) (string, []string) {
	annotations := maps.Clone(s.Annotations)
	if _, ok := annotations[corev1.EndpointsLastChangeTriggerTime]; ok {
		annotations[corev1.EndpointsLastChangeTriggerTime] = "<set>"
	}
	var owners []string
	for _, o := range s.OwnerReferences {
		owners = append(owners, fmt.Sprintf("%s/%s controller=%v", o.Kind, o.Name, o.Controller != nil && *o.Controller))
	}
	var ports []string
	for _, p := range s.Ports {
		b, _ := json.Marshal(p)
		ports = append(ports, string(b))
	}
	slices.Sort(ports)
	var eps []string
	for _, e := range s.Endpoints {
		if e.TargetRef != nil {
			e.TargetRef = &corev1.ObjectReference{Kind: e.TargetRef.Kind, Namespace: e.TargetRef.Namespace, Name: e.TargetRef.Name}
		}
		b, _ := json.Marshal(e)
		eps = append(eps, string(b))
	}
	b, _ := json.Marshal(map[string]any{
		"generateName": s.GenerateName, "labels": s.Labels, "annotations": annotations, "owners": owners,
		"addressType": s.AddressType, "ports": ports, "portsNil": s.Ports == nil,
	})
	return strings.ReplaceAll(string(b), `\"`, `'`), eps
}
