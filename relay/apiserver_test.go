package relay

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	authnv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/internal/informer"
	"github.com/netplane/netplane/internal/podrelay"
	"github.com/netplane/netplane/internal/role"
)

// One API server serves the package's tests that need one.
func TestMain(m *testing.M) { framework.RunShared(m) }

const relayNS = "relay-test"

// serviceAccount makes a service account, lets it watch every pod when
// watch is set, and returns a token of it.
func serviceAccount(t *testing.T, c kubernetes.Interface, name string, watch bool) string {
	t.Helper()
	ctx := framework.Ctx(t)
	if _, err := c.CoreV1().ServiceAccounts(relayNS).Create(ctx, &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if watch {
		if _, err := c.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "relay-test-" + name},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "relay-test-" + name},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "relay-test-" + name},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: relayNS}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	tr, err := c.CoreV1().ServiceAccounts(relayNS).CreateToken(ctx, name, &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(3600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// testPod is a running pod with its status, as a kubelet would leave it.
func createRunning(t *testing.T, c kubernetes.Interface, name, ip string, labels map[string]string) {
	t.Helper()
	ctx := framework.Ctx(t)
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: relayNS, Name: name, Labels: labels},
		Spec: v1.PodSpec{NodeName: "node-1", Containers: []v1.Container{{Name: "c", Image: "pause", Ports: []v1.ContainerPort{{Name: "http", ContainerPort: 8080}}}}}}
	p, err := c.CoreV1().Pods(relayNS).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status = v1.PodStatus{Phase: v1.PodRunning, PodIP: ip, PodIPs: []v1.PodIP{{IP: ip}},
		Conditions: []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionTrue}}}
	if _, err := c.CoreV1().Pods(relayNS).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestNodeRolesReadThePodsThroughARelay runs the relay role against a real
// API server, and reads it as a node role does: through a factory whose
// pods come from the relays behind a Service, with a service account's
// token.
// runRelay runs the relay role in this process on a free port of loopback,
// serving crt and key, until the test ends; it returns the port and the
// registry of its metrics.
func runRelay(t *testing.T, c kubernetes.Interface, crt, key string) (int, *prometheus.Registry) {
	ports, err := framework.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	cfg := v1alpha1.Default()
	cfg.Roles = []string{v1alpha1.RoleRelay}
	cfg.Relay = v1alpha1.Relay{BindAddress: fmt.Sprint("127.0.0.1:", ports[0]), TLSCertFile: crt, TLSKeyFile: key}
	reg := prometheus.NewRegistry()
	d := role.Deps{Role: v1alpha1.RoleRelay, Config: cfg, Client: c, Factory: informer.New(c), Checks: role.NewChecks(), Metrics: reg, Log: testr.New(t)}
	ctx, stop := context.WithCancel(framework.Ctx(t))
	done := make(chan error, 1)
	go func() { done <- Role(d)[0].Run(ctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("the relay stopped with %v", err)
		}
	})
	return ports[0], reg
}

func TestNodeRolesReadThePodsThroughARelay(t *testing.T) {
	api := framework.SharedAPIServer(t, framework.Options{})
	c, ctx := api.Client, framework.Ctx(t)
	if _, err := c.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: relayNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		createRunning(t, c, fmt.Sprint("p", i), fmt.Sprintf("10.8.0.%d", i+1), map[string]string{"app": "web"})
	}

	// The relay, in this process, on a free port, with a certificate of
	// its Service's name.
	ca, crt, key := framework.ServingCert(t, "netplane-relay."+relayNS+".svc")
	port, reg := runRelay(t, c, crt, key)

	// Its Service and EndpointSlice, as the chart and the EndpointSlice
	// controller would make them.
	if _, err := c.CoreV1().Services(relayNS).Create(ctx, &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: "netplane-relay"},
		Spec: v1.ServiceSpec{ClusterIP: v1.ClusterIPNone, Ports: []v1.ServicePort{{Name: podrelay.PortName, Port: int32(port)}}}}, metav1.CreateOptions{}); err != nil { //nolint:gosec // a port
		t.Fatal(err)
	}
	if _, err := c.DiscoveryV1().EndpointSlices(relayNS).Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "netplane-relay-1", Labels: map[string]string{discoveryv1.LabelServiceName: "netplane-relay"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To(podrelay.PortName), Port: ptr.To(int32(port))}}, //nolint:gosec // a port
		// The API server refuses loopback addresses in EndpointSlices: an
		// address of documentation's, which the readers' dialer takes to
		// the relay on loopback.
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"192.0.2.1"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	relayConfig := func(token string) *rest.Config {
		rc := rest.CopyConfig(api.RestConfig)
		rc.BearerToken, rc.BearerTokenFile = token, ""
		rc.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			if addr == fmt.Sprint("192.0.2.1:", port) {
				addr = fmt.Sprint("127.0.0.1:", port)
			}
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		}
		return rc
	}
	read := func(token string) (cache.Indexer, *atomic.Int64, chan string) {
		rc := relayConfig(token)
		pc, err := podrelay.Client(c, rc, relayNS+"/netplane-relay", ca, "node-1")
		if err != nil {
			t.Fatal(err)
		}
		f := informer.New(c)
		f.Source(informer.Pods, pc)
		h := f.Register(informer.View{Kind: informer.Pods, Name: "node"})
		var updates atomic.Int64
		changed := make(chan string, 100)
		f.Start(ctx)
		if _, err := h.AddEventHandler(cache.ResourceEventHandlerFuncs{
			UpdateFunc: func(_, cur any) { updates.Add(1); changed <- cur.(*v1.Pod).Name },
		}); err != nil {
			t.Fatal(err)
		}
		return h.Indexer(), &updates, changed
	}

	pods, updates, changed := read(serviceAccount(t, c, "node", true))
	t.Run("every pod, as its digest", func(t *testing.T) {
		err := framework.Poll(ctx, 20*time.Millisecond, 30*time.Second, "the node's view of the pods", func(context.Context) error {
			if n := len(pods.List()); n != 20 {
				return fmt.Errorf("%d pods", n)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		o, _, _ := pods.GetByKey(relayNS + "/p3")
		p := o.(*v1.Pod)
		if p.Status.PodIP != "10.8.0.4" || p.Labels["app"] != "web" || p.Spec.Containers[0].Ports[0].Name != "http" || len(p.Status.Conditions) != 0 || p.Spec.Containers[0].Image != "" {
			t.Errorf("p3 read as %+v, want its digest", p)
		}

		// Readiness flips, which no node's rules read, then a label.
		got, _ := c.CoreV1().Pods(relayNS).Get(ctx, "p1", metav1.GetOptions{})
		got.Status.Conditions[0].Status = v1.ConditionFalse
		if _, err := c.CoreV1().Pods(relayNS).UpdateStatus(ctx, got, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		got, _ = c.CoreV1().Pods(relayNS).Get(ctx, "p2", metav1.GetOptions{})
		got.Labels["app"] = "db"
		if _, err := c.CoreV1().Pods(relayNS).Update(ctx, got, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		select {
		case name := <-changed:
			if name != "p2" {
				t.Errorf("the first change the node read was %s's; p1's readiness is no change to a node", name)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("p2's new label never reached the node")
		}
		if n := updates.Load(); n != 1 {
			t.Errorf("%d updates reached the node, want 1", n)
		}
	})

	t.Run("no one the API server would not let watch pods", func(t *testing.T) {
		rc := relayConfig(serviceAccount(t, c, "app", false))
		pc, err := podrelay.Client(c, rc, relayNS+"/netplane-relay", ca, "node-1")
		if err != nil {
			t.Fatal(err)
		}
		err = framework.Poll(ctx, 100*time.Millisecond, 30*time.Second, "the relay's answer", func(ctx context.Context) error {
			_, err := pc.CoreV1().Pods("").List(ctx, metav1.ListOptions{Limit: 1})
			if apierrors.IsServiceUnavailable(err) {
				return err // not listed yet
			}
			if !apierrors.IsForbidden(err) {
				t.Fatalf("a service account without access to pods listed them from the relay: %v", err)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})

	t.Run("an API server restart reaches the node as changes, not as a list", func(t *testing.T) {
		listed := func() float64 {
			mfs, _ := reg.Gather()
			for _, mf := range mfs {
				if mf.GetName() == "netplane_relay_sent_bytes_total" {
					for _, m := range mf.GetMetric() {
						if m.GetLabel()[0].GetValue() == "list" {
							return m.GetCounter().GetValue()
						}
					}
				}
			}
			return 0
		}
		before := listed()
		api.KillAPIServer()
		if _, err := api.RestartAPIServer(time.Minute); err != nil {
			t.Fatal(err)
		}
		for len(changed) > 0 {
			<-changed
		}
		got, err := c.CoreV1().Pods(relayNS).Get(ctx, "p4", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got.Labels["app"] = "cache"
		if _, err := c.CoreV1().Pods(relayNS).Update(ctx, got, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		deadline := time.After(60 * time.Second)
		for seen := false; !seen; {
			select {
			case name := <-changed:
				seen = name == "p4"
			case <-deadline:
				t.Fatal("p4's new label never reached the node after the API server's restart")
			}
		}
		if after := listed(); after != before {
			t.Errorf("the node listed the relay again (%.0f bytes of lists): the relay's own relist must reach it as changes", after-before)
		}
	})
}
