package controllers

//lint:file-ignore SA1019 mirroring reads the Endpoints API, deprecated since v1.33, by design: it exists for users who still write Endpoints.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/controllers/endpointslice"
	"github.com/netplane/netplane/controllers/mirroring"
	"github.com/netplane/netplane/e2e/apitest"
	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/internal/informer"
	"github.com/netplane/netplane/internal/process"
	"github.com/netplane/netplane/internal/role"
)

// The role tests share one etcd + kube-apiserver (started on first use)
// and give each test its own namespace.
func TestMain(m *testing.M) { framework.RunShared(m) }

// replica is one in-process run of the controller role on its own manager,
// as the netplane process runs it.
type replica struct {
	checks *role.Checks
	writes *apitest.WriteCounter
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

func startReplica(t *testing.T, s *framework.APIServer, log logr.Logger, change func(*v1alpha1.Controller)) *replica {
	t.Helper()
	cfg := v1alpha1.Default()
	cfg.Roles = []string{v1alpha1.RoleController}
	cfg.Controller.LeaderElection.LeaseDuration = metav1.Duration{Duration: 3 * time.Second}
	cfg.Controller.LeaderElection.RenewDeadline = metav1.Duration{Duration: 2 * time.Second}
	cfg.Controller.LeaderElection.RetryPeriod = metav1.Duration{Duration: 200 * time.Millisecond}
	change(&cfg.Controller)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	rc, writes := apitest.CountingConfig(s.RestConfig)
	client := kubernetes.NewForConfigOrDie(rc)
	r := &replica{checks: role.NewChecks(), writes: writes, done: make(chan error, 1)}
	cfg.HealthBindAddress, cfg.MetricsBindAddress = "", ""
	mgr, err := process.NewManager(cfg, rc, r.checks, log)
	if err != nil {
		t.Fatal(err)
	}
	d := role.Deps{Config: cfg, RestConfig: rc, Client: client, Factory: informer.New(client), Checks: r.checks,
		Metrics: prometheus.NewRegistry(), Log: log}
	if err := process.AddParts(mgr, cfg, rc, Role(d), log); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- mgr.Start(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop ends the replica and checks that it stopped gracefully.
func (r *replica) stop(t *testing.T) {
	r.once.Do(func() {
		r.cancel()
		select {
		case err := <-r.done:
			if err != nil {
				t.Errorf("the manager returned %v on a graceful stop, want nil", err)
			}
		case <-time.After(15 * time.Second):
			t.Errorf("role did not stop within 15s")
		}
	})
}

func TestTwoReplicasOnlyTheLeaderWrites(t *testing.T) {
	s := framework.SharedAPIServer(t, framework.Options{})
	lease := fmt.Sprintf("netplane-test-%d", time.Now().UnixNano())
	withLease := func(c *v1alpha1.Controller) { c.LeaderElection.ResourceName = lease }
	a := startReplica(t, s, testr.New(t), withLease)
	b := startReplica(t, s, testr.New(t), withLease)
	framework.Eventually(t, 30*time.Second, "both replicas ready", func() error {
		ea, eb := a.checks.Ready(), b.checks.Ready()
		if !(ea == nil && eb == nil) {
			return fmt.Errorf("a: %v; b: %v", ea, eb)
		}
		return nil
	})

	ns := apitest.NewNamespace(t, s, "leader")
	apitest.CreateNode(t, s, "node-1", "")
	apitest.CreateService(t, s.Client, ns, apitest.Service("a"))
	t.Cleanup(func() { s.Client.CoreV1().Services(ns).Delete(context.Background(), "a", metav1.DeleteOptions{}) })
	for i := range 3 {
		apitest.CreatePod(t, s.Client, ns, apitest.Pod("a", i))
	}
	apitest.WaitEndpoints(t, s, ns, "a", endpointslice.ControllerName, 3)
	leader, follower := a, b
	if a.writes.Total() == 0 {
		leader, follower = b, a
	}
	if leader.writes.Total() == 0 || follower.writes.Total() != 0 {
		t.Fatalf("writes: leader %d, follower %d; want only one replica writing", leader.writes.Total(), follower.writes.Total())
	}

	// A graceful stop releases the Lease; the other replica takes over.
	leader.stop(t)
	apitest.CreatePod(t, s.Client, ns, apitest.Pod("a", 3))
	apitest.WaitEndpoints(t, s, ns, "a", endpointslice.ControllerName, 4)
	if follower.writes.Total() == 0 {
		t.Errorf("the remaining replica did not take over")
	}
}

// A leader that can no longer renew its Lease stops writing at once, and
// campaigns again: once the Lease is free it wins it back and resumes,
// without the process stopping.
func TestALostLeaseStopsTheLeaderUntilItWinsItBack(t *testing.T) {
	s := framework.SharedAPIServer(t, framework.Options{})
	name := fmt.Sprintf("netplane-test-%d", time.Now().UnixNano())
	// The replica's writes when it logged losing and winning the Lease.
	type mark struct {
		what   string
		writes int
	}
	marks := make(chan mark, 16)
	var r *replica
	started := make(chan struct{}) // r is set
	log := funcr.New(func(_, args string) {
		for _, w := range []string{"leader election lost", "leader election won"} {
			if strings.Contains(args, w) {
				<-started
				marks <- mark{w, r.writes.Total()}
			}
		}
	}, funcr.Options{})
	r = startReplica(t, s, log, func(c *v1alpha1.Controller) { c.LeaderElection.ResourceName = name })
	close(started)
	next := func(want string) mark {
		t.Helper()
		select {
		case m := <-marks:
			if m.what != want {
				t.Fatalf("the replica logged %q, want %q", m.what, want)
			}
			return m
		case err := <-r.done:
			r.once.Do(func() {})
			t.Fatalf("the replica stopped (%v) waiting for %q", err, want)
		case <-time.After(30 * time.Second):
			t.Fatalf("the replica did not log %q within 30s", want)
		}
		return mark{}
	}
	next("leader election won")
	ns := apitest.NewNamespace(t, s, "lease")
	apitest.CreateNode(t, s, "node-1", "")
	apitest.CreateService(t, s.Client, ns, apitest.Service("a"))
	apitest.CreatePod(t, s.Client, ns, apitest.Pod("a", 0))
	apitest.WaitEndpoints(t, s, ns, "a", endpointslice.ControllerName, 1)

	// Another holder takes the Lease for 4 s. The replica renews every
	// 200 ms: an update between its renewals may conflict, and is made
	// again on the Lease as it then is.
	leases := s.Client.CoordinationV1().Leases("kube-system")
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		lease, err := leases.Get(framework.Ctx(t), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := metav1.NewMicroTime(time.Now())
		lease.Spec.HolderIdentity, lease.Spec.RenewTime, lease.Spec.AcquireTime = ptr.To("usurper"), &now, &now
		lease.Spec.LeaseDurationSeconds = ptr.To[int32](4)
		_, err = leases.Update(framework.Ctx(t), lease, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	lost := next("leader election lost")
	apitest.CreatePod(t, s.Client, ns, apitest.Pod("a", 1))
	won := next("leader election won")
	if won.writes != lost.writes {
		t.Errorf("the replica wrote %d times without the Lease", won.writes-lost.writes)
	}
	apitest.WaitEndpoints(t, s, ns, "a", endpointslice.ControllerName, 2)
}

func TestRoleMirrorsEndpoints(t *testing.T) {
	s := framework.SharedAPIServer(t, framework.Options{})
	startReplica(t, s, testr.New(t), func(c *v1alpha1.Controller) {
		c.LeaderElection.LeaderElect = false
		c.MirroringMaxEndpointsPerSubset = 2
	})
	ns := apitest.NewNamespace(t, s, "mirror")
	apitest.CreateService(t, s.Client, ns, apitest.Service("ext", func(svc *corev1.Service) { svc.Spec.Selector = nil }))
	eps := s.Client.CoreV1().Endpoints(ns)
	ep := &corev1.Endpoints{
		ObjectMeta: metav1.ObjectMeta{Name: "ext", Labels: map[string]string{"team": "x"}},
		Subsets: []corev1.EndpointSubset{{
			Addresses:         []corev1.EndpointAddress{{IP: "192.0.2.1"}},
			NotReadyAddresses: []corev1.EndpointAddress{{IP: "192.0.2.2"}},
			Ports:             []corev1.EndpointPort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}},
		}},
	}
	ep, err := eps.Create(framework.Ctx(t), ep, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mirrored := func(want string) {
		t.Helper()
		framework.Eventually(t, 30*time.Second, "mirrored slices", func() error {
			got := apitest.ListOwn(t, s.Client, ns, "ext", mirroring.ControllerName)
			desc := fmt.Sprint(mirrorSummary(got))
			if desc != want {
				return errors.New(desc)
			}
			return nil
		})
	}
	mirrored("[IPv4 team=x 192.0.2.1:true 192.0.2.2:false]")

	ep.Subsets[0].Addresses = append(ep.Subsets[0].Addresses, corev1.EndpointAddress{IP: "192.0.2.3"}, corev1.EndpointAddress{IP: "2001:db8::1"})
	if ep, err = eps.Update(framework.Ctx(t), ep, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// At most 2 addresses per subset: the rest is skipped with an event.
	mirrored("[IPv4 team=x 192.0.2.1:true 192.0.2.3:true]")
	framework.Eventually(t, 30*time.Second, "TooManyAddressesToMirror event", func() error {
		list, err := s.Client.CoreV1().Events(ns).List(framework.Ctx(t), metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, e := range list.Items {
			if e.Reason == "TooManyAddressesToMirror" && e.InvolvedObject.Name == "ext" {
				return nil
			}
		}
		return fmt.Errorf("%d events, none about skipped addresses", len(list.Items))
	})

	ep.Labels[discovery.LabelSkipMirror] = "true"
	if ep, err = eps.Update(framework.Ctx(t), ep, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	mirrored("[]")
	delete(ep.Labels, discovery.LabelSkipMirror)
	if _, err = eps.Update(framework.Ctx(t), ep, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	mirrored("[IPv4 team=x 192.0.2.1:true 192.0.2.3:true]")
	if err := eps.Delete(framework.Ctx(t), "ext", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	mirrored("[]")
}

// mirrorSummary describes slices as "family team=label addr:ready...".
func mirrorSummary(ss []*discovery.EndpointSlice) []string {
	var out []string
	for _, s := range ss {
		d := fmt.Sprintf("%s team=%s", s.AddressType, s.Labels["team"])
		for _, e := range s.Endpoints {
			d += fmt.Sprintf(" %s:%v", e.Addresses[0], *e.Conditions.Ready)
		}
		out = append(out, d)
	}
	return out
}
