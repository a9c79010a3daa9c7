package controllers

//lint:file-ignore SA1019 mirroring reads the Endpoints API, deprecated since v1.33, by design: it exists for users who still write Endpoints.

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/controllers/endpointslice"
	"github.com/netplane/netplane/e2e/apitest"
	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/internal/informer"
	"github.com/netplane/netplane/internal/role"
)

// TestLeadRunsAgainAfterItStopped: a replica that loses its Lease sees its
// elected part return (its context ends) and, once it wins the Lease
// again, the manager calls the same part of the same role again. The
// second term must write the slices of what changed meanwhile and record
// events, as the first did. One function on purpose: the two terms and
// the pause between them are one story told in order on one role.
func TestLeadRunsAgainAfterItStopped(t *testing.T) {
	s := framework.SharedAPIServer(t, framework.Options{})
	cfg := v1alpha1.Default()
	cfg.Roles = []string{v1alpha1.RoleController}
	cfg.Controller.MirroringMaxEndpointsPerSubset = 1
	rc, writes := apitest.CountingConfig(s.RestConfig)
	client := kubernetes.NewForConfigOrDie(rc)
	d := role.Deps{Config: cfg, RestConfig: rc, Client: client, Factory: informer.New(client), Checks: role.NewChecks(),
		Metrics: prometheus.NewRegistry(), Log: testr.New(t)}
	parts := Role(d)
	if len(parts) != 2 || parts[0].Elected || !parts[1].Elected {
		t.Fatalf("want a part on every replica and an elected one, got %+v", parts)
	}
	ctx, cancel := context.WithCancel(context.Background())
	synced := make(chan error, 1)
	go func() { synced <- parts[0].Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-synced; err != nil {
			t.Errorf("the caches' part returned %v", err)
		}
	})
	term := func() (stop func()) {
		lctx, lcancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- parts[1].Run(lctx) }()
		return func() {
			lcancel()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("the elected part returned %v", err)
				}
			case <-time.After(15 * time.Second):
				t.Fatal("the elected part still runs 15s after its context ended")
			}
		}
	}

	ns := apitest.NewNamespace(t, s, "rerun")
	apitest.CreateNode(t, s, "node-1", "")
	stop := term()
	apitest.CreateService(t, s.Client, ns, apitest.Service("a"))
	apitest.CreatePod(t, s.Client, ns, apitest.Pod("a", 0))
	apitest.WaitEndpoints(t, s, ns, "a", endpointslice.ControllerName, 1)
	stop()

	// Not leading: the changes wait for the next term, and nothing is
	// written meanwhile.
	idle := writes.Total()
	apitest.CreateService(t, s.Client, ns, apitest.Service("b"))
	apitest.CreatePod(t, s.Client, ns, apitest.Pod("b", 0))
	apitest.CreatePod(t, s.Client, ns, apitest.Pod("a", 1))
	apitest.CreateService(t, s.Client, ns, apitest.Service("ext", func(svc *corev1.Service) { svc.Spec.Selector = nil }))
	_, err := s.Client.CoreV1().Endpoints(ns).Create(framework.Ctx(t), &corev1.Endpoints{
		ObjectMeta: metav1.ObjectMeta{Name: "ext"},
		Subsets: []corev1.EndpointSubset{{
			Addresses: []corev1.EndpointAddress{{IP: "192.0.2.1"}, {IP: "192.0.2.2"}},
			Ports:     []corev1.EndpointPort{{Port: 80, Protocol: corev1.ProtocolTCP}},
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n := writes.Total(); n != idle {
		t.Errorf("%d slice writes after the elected part returned", n-idle)
	}

	stop = term()
	defer stop()
	apitest.WaitEndpoints(t, s, ns, "b", endpointslice.ControllerName, 1)
	apitest.WaitEndpoints(t, s, ns, "a", endpointslice.ControllerName, 2)
	// At most 1 address per subset: the mirroring controller skips one
	// and says so through the second term's event broadcaster.
	framework.Eventually(t, 30*time.Second, "TooManyAddressesToMirror event of the second term", func() error {
		list, err := s.Client.CoreV1().Events(ns).List(framework.Ctx(t), metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, e := range list.Items {
			if e.Reason == "TooManyAddressesToMirror" && e.Source.Component == mirrorSource.Component {
				return nil
			}
		}
		return fmt.Errorf("%d events, none about skipped addresses", len(list.Items))
	})
}
