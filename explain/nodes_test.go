package explain

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	netv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/testcluster"
)

// The real thing: a kube-apiserver, two nodes in network namespaces on
// one underlay subnet each running `netplane --role=node`, pods made
// through the CNI plugin the nodes install, serving echo on 80 and 8080.
// `netplane explain` runs inside a node's namespace, as in the node
// agent's pod, and its verdict is compared with a real connection.

func TestMain(m *testing.M) { framework.Main(m) }

type cluster struct {
	*testcluster.Cluster
	t    *testing.T
	pods map[string]*testcluster.Pod
	bin  string
}

func newCluster(t *testing.T) *cluster {
	c := &cluster{t: t, pods: map[string]*testcluster.Pod{}, bin: filepath.Join(framework.NetplaneBinaries(t), "netplane")}
	c.Cluster = testcluster.New(t, testcluster.Options{
		// A router that is never asked: what is not dropped before goes there.
		Subnets: []testcluster.Subnet{{V4: "192.168.79.", Gateway: "192.168.79.254"}},
		Flags:   func(*testcluster.Node) []string { return agentFlags },
		DelPods: true,
	})
	for _, ns := range []string{"x", "y"} {
		obj := &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"ns": ns}}}
		if _, err := c.API.Client.CoreV1().Namespaces().Create(c.Ctx, obj, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// agentFlags are the node agents'. Their full sync, which would repair a
// kernel changed by hand, comes only every 10 minutes.
var agentFlags = []string{"--service-cidrs=10.96.0.0/16", "--sync-period=10m", "--v=1"}

// addPod makes pod key on n through the node's CNI plugin, serving echo on
// 80 and 8080 (named http), and its API object.
func (c *cluster) addPod(key string, n *testcluster.Node, labels map[string]string) {
	t := c.t
	p := c.AddPod(t, n, strings.ReplaceAll(key, "/", "-"))
	p.NS.ServeEcho(t, ":80", key)
	p.NS.ServeEcho(t, ":8080", key)
	ns, name, _ := strings.Cut(key, "/")
	c.WritePod(t, &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: v1.PodSpec{NodeName: n.Name, Containers: []v1.Container{{Name: "c", Image: "registry.invalid/none",
			Ports: []v1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: v1.ProtocolTCP}}}}},
		Status: testcluster.Running(p.IP)})
	c.pods[key] = p
}

// addService is Service ns/name, port 80 → 8080 of the given pods, with its
// EndpointSlice written by hand (no controller runs here).
func (c *cluster) addService(ns, name string, mod func(*v1.Service), backends ...string) *v1.Service {
	return c.addServiceWith(ns, name, mod, testcluster.Ready, backends...)
}

// addServiceWith is addService with the endpoints' conditions.
func (c *cluster) addServiceWith(ns, name string, mod func(*v1.Service), cond discoveryv1.EndpointConditions, backends ...string) *v1.Service {
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1.ServiceSpec{Ports: []v1.ServicePort{{Port: 80, Protocol: v1.ProtocolTCP}}}}
	if mod != nil {
		mod(svc)
	}
	var endpoints []discoveryv1.Endpoint
	for _, b := range backends {
		e := testcluster.Endpoint(c.pods[b], cond)
		bns, bname, _ := strings.Cut(b, "/")
		e.TargetRef = &v1.ObjectReference{Kind: "Pod", Namespace: bns, Name: bname}
		endpoints = append(endpoints, e)
	}
	return c.AddService(c.t, svc, discoveryv1.EndpointPort{Name: ptr.To(""), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.ProtocolTCP)}, endpoints...)
}

// setPolicies makes the API's policies of namespaces x and y exactly nps.
func (c *cluster) setPolicies(nps ...*netv1.NetworkPolicy) {
	for _, ns := range []string{"x", "y"} {
		err := c.API.Client.NetworkingV1().NetworkPolicies(ns).DeleteCollection(c.Ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			c.t.Fatal(err)
		}
	}
	for _, np := range nps {
		if _, err := c.API.Client.NetworkingV1().NetworkPolicies(np.Namespace).Create(c.Ctx, np.DeepCopy(), metav1.CreateOptions{}); err != nil {
			c.t.Fatal(err)
		}
	}
}

// explain runs `netplane explain -o json` in n's namespace.
func (c *cluster) explain(n *testcluster.Node, args ...string) (*Explanation, string, error) {
	cmd := n.NS.Command(c.bin, append([]string{"explain", "--kubeconfig=" + n.Kubeconfig, "-o", "json"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	raw, err := cmd.Output()
	out := string(raw)
	if err != nil {
		return nil, out + stderr.String(), err
	}
	var x Explanation
	if err := json.Unmarshal([]byte(out), &x); err != nil {
		return nil, out, fmt.Errorf("%v: %s", err, out)
	}
	return &x, out, nil
}

// connects is whether a real TCP connection from pod src to addr gets an
// answer.
func (c *cluster) connects(src, addr string) bool {
	_, err := c.pods[src].NS.Ask("tcp", addr, 700*time.Millisecond)
	return err == nil
}
