package testcluster

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/netplane/netplane/cni/conflist"
	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
	"github.com/netplane/netplane/podnet"
)

// Pod is a pod's namespace, made through a node's CNI plugin or by hand.
type Pod struct {
	ID      string // its container ID
	Node    *Node
	NS      *netns.NS
	IP, IP6 string // IP6 "" unless the cluster is dual-stack
	Link    string // a hand-made pod's link on the node (handmade.go)
}

// AddPod makes a pod namespace on n through the conflist and plugin its
// agent installed, as a runtime would, with container ID id. It fails
// unless the pod has an address of each of the cluster's families.
func (c *Cluster) AddPod(t testing.TB, n *Node, id string) *Pod {
	t.Helper()
	return c.AddPodWithHostPorts(t, n, id)
}

// AddPodWithHostPorts is AddPod for a pod with hostPorts, which a runtime
// passes in the portMappings capability.
func (c *Cluster) AddPodWithHostPorts(t testing.TB, n *Node, id string, ports ...conflist.PortMapping) *Pod {
	t.Helper()
	p := &Pod{ID: id, Node: n, NS: c.newNS(t, "pod")}
	list, err := libcni.ConfListFromFile(filepath.Join(n.ConfDir(), podnet.ConflistName))
	if err != nil {
		t.Fatal(err)
	}
	cni := libcni.NewCNIConfigWithCacheDir([]string{n.BinDir()}, filepath.Join(n.Dir, "cache"), nil)
	rt := &libcni.RuntimeConf{ContainerID: id, NetNS: p.NS.Path, IfName: "eth0"}
	if len(ports) > 0 {
		rt.CapabilityArgs = map[string]any{"portMappings": ports}
	}
	var res *current.Result
	err = n.NS.Do(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		raw, err := cni.AddNetworkList(ctx, list, rt)
		if err == nil {
			res, err = current.NewResultFromResult(raw)
		}
		return err
	})
	want := 1
	if c.opts.IPv6 {
		want = 2
	}
	if err != nil || len(res.IPs) != want {
		t.Fatalf("ADD %s on %s: %v (%v), want %d addresses", id, n.Name, err, res, want)
	}
	if c.opts.DelPods {
		t.Cleanup(func() {
			_ = n.NS.Do(func() error { return cni.DelNetworkList(context.Background(), list, rt) })
		})
	}
	p.IP = res.IPs[0].Address.IP.String()
	if want == 2 {
		p.IP6 = res.IPs[1].Address.IP.String()
	}
	return p
}

// WritePod creates obj, or updates the labels of the pod of its name, and
// writes its status, as the kubelet would; it returns what the API server
// holds.
func (c *Cluster) WritePod(t testing.TB, obj *v1.Pod) *v1.Pod {
	t.Helper()
	pods := c.API.Client.CoreV1().Pods(obj.Namespace)
	got, err := pods.Get(c.Ctx, obj.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		got, err = pods.Create(c.Ctx, obj, metav1.CreateOptions{})
	case err == nil:
		got.Labels = obj.Labels
		got, err = pods.Update(c.Ctx, got, metav1.UpdateOptions{})
	}
	if err != nil {
		t.Fatal(err)
	}
	got.Status = obj.Status
	if got, err = pods.UpdateStatus(c.Ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return got
}

// Running is the status of a running pod at ips ("" left out).
func Running(ips ...string) v1.PodStatus {
	s := v1.PodStatus{Phase: v1.PodRunning}
	for _, ip := range ips {
		if ip != "" {
			s.PodIPs = append(s.PodIPs, v1.PodIP{IP: ip})
		}
	}
	if len(s.PodIPs) > 0 {
		s.PodIP = s.PodIPs[0].IP
	}
	return s
}

// Metric is the value of the first sample of name whose labels contain
// labels (`reason="no-key"`), scraped from n's metrics server (see Served).
func (n *Node) Metric(name, labels string) (float64, error) {
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DialContext: func(_ context.Context, network, addr string) (net.Conn, error) { return n.NS.Dial(network, addr) }}}
	code, body, err := framework.HTTPGet(client, "http://"+n.Metrics+"/metrics")
	if err != nil || code != http.StatusOK {
		return 0, fmt.Errorf("scrape %s: %d %v", n.Name, code, err)
	}
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `(\{[^}]*\})? (\S+)$`)
	for _, m := range re.FindAllStringSubmatch(body, -1) {
		if strings.Contains(m[1], labels) {
			return strconv.ParseFloat(m[2], 64)
		}
	}
	return 0, fmt.Errorf("%s{%s} not among %s's metrics", name, labels, n.Name)
}

// Ready is the condition of an endpoint that takes traffic.
var Ready = discoveryv1.EndpointConditions{Ready: ptr.To(true)}

// Endpoint is p's IPv4 address on its node, with conditions cond.
func Endpoint(p *Pod, cond discoveryv1.EndpointConditions) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Addresses: []string{p.IP}, NodeName: &p.Node.Name, Conditions: cond}
}

// AddService creates svc and its IPv4 EndpointSlice <name>-1 with port and
// endpoints, written by hand as no controller runs here, and returns the
// Service the API server holds.
func (c *Cluster) AddService(t testing.TB, svc *v1.Service, port discoveryv1.EndpointPort, endpoints ...discoveryv1.Endpoint) *v1.Service {
	t.Helper()
	svc, err := c.API.Client.CoreV1().Services(svc.Namespace).Create(c.Ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: svc.Namespace, Name: svc.Name + "-1", Labels: map[string]string{
			discoveryv1.LabelServiceName: svc.Name, discoveryv1.LabelManagedBy: "e2e.netplane.io"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   endpoints,
		Ports:       []discoveryv1.EndpointPort{port},
	}
	if _, err := c.API.Client.DiscoveryV1().EndpointSlices(svc.Namespace).Create(c.Ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return svc
}
