package encryption

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	netv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
	"github.com/netplane/netplane/e2e/testcluster"
)

// servicesThroughTheTunnel: a NodePort Service whose one backend is the
// pod on node2 answers on its ClusterIP from node1's pod and from node1
// itself, and on node1's NodePort from outside (the router): node1
// forwards into the tunnel from an address node2 accepts.
func (c *cluster) servicesThroughTheTunnel(t *testing.T) {
	backend, n1 := c.nodes[1].pod, c.nodes[0]
	svc, nodePort := c.nodePortToPod2(t, "echo")
	cip := net.JoinHostPort(svc.Spec.ClusterIP, "80")
	for _, probe := range []struct {
		what string
		from *netns.NS
		addr string
	}{{"ClusterIP from pod1", n1.pod.NS, cip}, {"ClusterIP from node1", n1.NS, cip}, {"NodePort of node1 from the router", c.Router, nodePort}} {
		framework.Eventually(t, 20*time.Second, probe.what+" answered by the pod on node2", func() error {
			a, err := probe.from.Ask("tcp", probe.addr, time.Second)
			if name, _ := netns.SplitAnswer(a); err != nil || name != backend.Name {
				return fmt.Errorf("answer %q, %v", a, err)
			}
			return nil
		})
	}
	if err := c.API.Client.CoreV1().Services("default").Delete(c.Ctx, "echo", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// policyThroughTheTunnel: a policy on node2's pod admitting only node3's
// pod is judged on node2 after decryption: node3's pod gets through, node1's
// does not; without the policy both do.
func (c *cluster) policyThroughTheTunnel(t *testing.T) {
	p1, p2, p3 := c.nodes[0].pod, c.nodes[1].pod, c.nodes[2].pod
	np := &netv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "only-pod3"},
		Spec: netv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": p2.Name}},
			Ingress: []netv1.NetworkPolicyIngressRule{{From: []netv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": p3.Name}}}}}}}}
	if _, err := c.API.Client.NetworkingV1().NetworkPolicies("default").Create(c.Ctx, np, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, 20*time.Second, "pod1 denied, pod3 allowed into pod2", func() error {
		if a, err := p1.NS.Ask("tcp", at(p2.IP), 300*time.Millisecond); err == nil {
			return fmt.Errorf("pod1 got %q", a)
		}
		if got, err := p3.NS.SeenTCP(at(p2.IP)); err != nil || got != p3.IP {
			return fmt.Errorf("pod3 saw %q, %v", got, err)
		}
		return nil
	})
	if err := c.API.Client.NetworkingV1().NetworkPolicies("default").Delete(c.Ctx, np.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, 20*time.Second, "pod1 allowed again", func() error {
		got, err := p1.NS.SeenTCP(at(p2.IP))
		if err == nil && !strings.HasPrefix(got, p1.IP) {
			err = fmt.Errorf("seen %q", got)
		}
		return err
	})
}

// heldNodePort makes a NodePort Service whose one backend is node2's pod,
// holds a connection from the router to node1's NodePort and starts
// asking over it (startTraffic, which also opens new connections there);
// stop closes it.
func (c *cluster) heldNodePort(t *testing.T) *traffic {
	_, nodePort := c.nodePortToPod2(t, "held")
	var conn *netns.EchoConn
	framework.Eventually(t, 20*time.Second, "a connection to node1's NodePort", func() (err error) {
		conn, err = c.Router.DialEcho(nodePort, 10*time.Second)
		return err
	})
	tr := startTraffic(c.Router, conn, nodePort)
	tr.held = conn
	t.Cleanup(func() { tr.stop() })
	return tr
}

// nodePortToPod2 makes the NodePort Service name, port 80, whose one
// backend is node2's pod on 8080, and returns it with node1's NodePort
// address.
func (c *cluster) nodePortToPod2(t *testing.T, name string) (*v1.Service, string) {
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeNodePort, Ports: []v1.ServicePort{{Name: "tcp", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: v1.ProtocolTCP}}}}
	svc = c.AddService(t, svc, discoveryv1.EndpointPort{Name: ptr.To("tcp"), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.ProtocolTCP)},
		testcluster.Endpoint(c.nodes[1].pod.Pod, testcluster.Ready))
	return svc, net.JoinHostPort(c.nodes[0].IP, strconv.Itoa(int(svc.Spec.Ports[0].NodePort)))
}
