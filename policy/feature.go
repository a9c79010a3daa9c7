package policy

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/internal/informer"
	"github.com/netplane/netplane/internal/role"
	"github.com/netplane/netplane/nft"
	"github.com/netplane/netplane/nodeview"
)

// This file is the node role's NetworkPolicy feature, the shell around the
// model: three informer views (pods, namespaces, NetworkPolicies) whose
// records go straight into the model (it is their only copy), one sync
// loop that renders what the model touched and programs it, and the
// reports of policies that do not compile.

// LogGroup is the NFLOG group denied packets are logged to with
// --network-policy-log-denied; the node role is its one listener.
const LogGroup = 27041

// logRate is how many denied packets per second and direction the kernel
// hands to the log at most; the log then writes one line per connection.
const logRate = 10

// logPrefix begins every denied packet's NFLOG prefix; the direction follows.
const logPrefix = "netplane-policy denied "

// Feature is the NetworkPolicy feature of the node role.
type Feature struct {
	log      logr.Logger
	cfg      v1alpha1.Node
	syncer   nft.Syncer
	loop     *nodeview.Loop
	metrics  *metrics
	recorder record.EventRecorder
	deps     role.Deps
	views    []*informer.Handle
	stop     func() // the event broadcaster's
	// deleteTable removes the table, for when enforcement is off.
	deleteTable func() error
	dialer      nft.Dialer // the network namespace of the NFLOG socket

	mu      sync.Mutex
	model   *Model
	render  *renderer
	invalid map[types.NamespacedName]string // policies whose last version did not compile: its resourceVersion

	// crd follows the ClusterNetworkPolicy CRD and runs the policies'
	// reflector while it is served; nil without an API server.
	crd *crdWatch
	// clusterReported: the resourceVersion of each ClusterNetworkPolicy
	// last read, so each version's problems are reported once.
	clusterReported map[string]string
}

// New builds the feature of the node role d: with enforcement on, it
// registers its metrics and its informer views, which must happen before
// the process's informers start.
func New(d role.Deps) (*Feature, error) {
	cfg := d.Config.Node
	if !cfg.NetworkPolicy.Enabled {
		return &Feature{log: d.Log.WithName("network-policy"), cfg: cfg,
			deleteTable: func() error { return nft.Delete(nft.Dialer{}, TableID) }}, nil
	}
	if d.Factory == nil {
		return nil, errors.New("network policy: no informer factory")
	}
	m := newMetrics()
	if err := d.Register(m.collectors()...); err != nil {
		return nil, err
	}
	rec, stop := d.Recorder("netplane-node", cfg.NodeName)
	e, err := newFeature(d, nft.NewProgrammer(nft.Dialer{}, TableID), m, rec)
	if err != nil {
		return nil, err
	}
	e.stop = stop
	for _, v := range []informer.View{
		{Kind: informer.Pods, Name: "network-policy", Record: func(o runtime.Object) any { return PodFromAPI(o.(*v1.Pod)) }},
		{Kind: informer.Namespaces, Name: "network-policy", Record: func(o runtime.Object) any { return NamespaceFromAPI(o.(*v1.Namespace)) }},
		{Kind: informer.NetworkPolicies, Name: "network-policy", Record: func(o runtime.Object) any { return policyRecordOf(o.(*netv1.NetworkPolicy)) }},
	} {
		v.Sink = &sink{e: e, kind: v.Kind}
		e.views = append(e.views, d.Factory.Register(v))
	}
	e.watchCluster(d)
	return e, nil
}

// newFeature is the enforcing feature with its parts given: what tests
// build on a fake kernel.
func newFeature(d role.Deps, syncer nft.Syncer, m *metrics, rec record.EventRecorder) (*Feature, error) {
	log, cfg := d.Log.WithName("network-policy"), d.Config.Node
	mc := Config{Node: cfg.NodeName}
	if cfg.NetworkPolicy.LogDenied {
		mc.Log = Log{Group: LogGroup, Rate: logRate, Prefix: logPrefix}
	}
	model := NewModel(mc)
	e := &Feature{log: log, cfg: cfg, syncer: syncer, metrics: m, recorder: rec, model: model, deps: d,
		render: newRenderer(model.Table()), invalid: map[types.NamespacedName]string{}, clusterReported: map[string]string{}}
	var err error
	if e.loop, err = nodeview.NewLoop(d, "network-policy", e.sync); err != nil {
		return nil, err
	}
	if pc, ok := syncer.(nft.PacketCounter); ok && m != nil {
		m.denied.read = deniedPacketsIn(pc, e.denyChains)
	}
	return e, nil
}

// Run enforces until ctx ends, then leaves the table in place: a restarted
// or upgraded agent adopts it, so enforcement has no gap either way. With
// enforcement off it removes the table and waits.
func (f *Feature) Run(ctx context.Context) error {
	if !f.cfg.NetworkPolicy.Enabled {
		if !nodeview.Await(ctx, f.deps) {
			return nil
		}
		if err := f.deleteTable(); err != nil {
			return fmt.Errorf("network policy is off, removing its table: %w", err)
		}
		f.log.Info("network policy enforcement is off; table removed", "table", TableID.String())
		<-ctx.Done()
		return nil
	}
	defer f.syncer.Close()
	if f.stop != nil {
		defer f.stop()
	}
	if _, err := os.Stat("/proc/sys/net/bridge/bridge-nf-call-iptables"); err != nil {
		f.log.Info("br_netfilter is not loaded: connections between pods of this node's bridge are not judged")
	}
	if f.cfg.NetworkPolicy.LogDenied {
		go f.logDenied(ctx)
	}
	f.deps.Factory.Start(ctx) // a view says it synced only once started
	synced := make([]cache.DoneChecker, len(f.views))
	for i, h := range f.views {
		synced[i] = h.Synced()
	}
	c, err := f.runCluster(ctx)
	if err != nil {
		return err
	}
	if c != nil {
		synced = append(synced, c)
	}
	// The first sync must see every pod, namespace and policy: a partial
	// picture would open what the table left in place still closes.
	f.loop.Run(ctx, synced...)
	f.log.Info("stopped; table left in place so enforcement goes on", "table", TableID.String())
	return nil
}

// sync renders what changed and programs it: every part of the table on
// a full sync, the touched parts otherwise.
func (f *Feature) sync(_ context.Context, full bool) error {
	start := time.Now()
	f.mu.Lock()
	var touched *nft.Touched
	if tc := f.model.TakeTouched(); tc == nil || f.render.t == nil {
		f.render.full()
	} else {
		touched = f.render.apply(tc)
	}
	policies, isolated := f.model.Counts()
	invalid := len(f.invalid)
	f.mu.Unlock()
	var err error
	if full || touched == nil {
		_, err = f.syncer.Sync(f.render.t, full)
	} else {
		_, err = f.syncer.SyncTouched(f.render.t, touched)
	}
	if err != nil {
		return err
	}
	kind := "partial"
	if full {
		kind = "full"
	}
	took := time.Since(start)
	f.metrics.policies.Set(float64(policies))
	f.metrics.isolated.Set(float64(isolated))
	f.metrics.invalid.Set(float64(invalid))
	f.log.V(2).Info("synced", "type", kind, "took", took, "policies", policies, "isolatedPods", isolated)
	return nil
}

// policyRecord is a NetworkPolicy compiled, or why it did not compile.
type policyRecord struct {
	meta metav1.ObjectMeta // namespace, name, uid, resourceVersion: for the key and events
	pol  *Policy
	err  error
}

func policyRecordOf(np *netv1.NetworkPolicy) *policyRecord {
	pol, err := Compile(np)
	return &policyRecord{meta: metav1.ObjectMeta{Namespace: np.Namespace, Name: np.Name, UID: np.UID,
		ResourceVersion: np.ResourceVersion}, pol: pol, err: err}
}

// GetObjectMeta is the record's key, for the informer layer.
func (r *policyRecord) GetObjectMeta() metav1.Object { m := r.meta; return &m }

func (r *policyRecord) key() types.NamespacedName {
	return types.NamespacedName{Namespace: r.meta.Namespace, Name: r.meta.Name}
}

// upsert applies a record to the model. Called with mu held.
func (f *Feature) upsert(obj any) {
	switch r := obj.(type) {
	case *Pod:
		f.model.UpsertPod(r)
	case *Namespace:
		f.model.UpsertNamespace(r)
	case *policyRecord:
		if r.err == nil {
			delete(f.invalid, r.key())
			f.model.UpsertPolicy(r.pol)
			return
		}
		if f.invalid[r.key()] != r.meta.ResourceVersion {
			f.invalid[r.key()] = r.meta.ResourceVersion
			f.reportInvalid(r)
		}
	case *clusterPolicyRecord:
		f.upsertCluster(r)
	case *Node:
		f.model.UpsertNode(r)
	}
}

// reportInvalid logs a policy that does not compile and records an event
// on it, saying what stays in force. Called with mu held.
func (f *Feature) reportInvalid(r *policyRecord) {
	kept := "nothing of it is enforced"
	if _, ok := f.model.policies[r.key()]; ok {
		kept = "its previous version stays in force"
	}
	f.log.Error(r.err, "NetworkPolicy not enforced", "policy", r.key().String(), "kept", kept)
	if f.recorder != nil {
		obj := &netv1.NetworkPolicy{ObjectMeta: r.meta}
		f.recorder.Eventf(obj, v1.EventTypeWarning, "InvalidNetworkPolicy", "not enforced on node %s: %v; %s", f.cfg.NodeName, r.err, kept)
	}
}

// remove takes a record's object out of the model. Called with mu held.
func (f *Feature) remove(obj any) {
	switch r := obj.(type) {
	case *Pod:
		f.model.DeletePod(r.Key())
	case *Namespace:
		f.model.DeleteNamespace(r.Name)
	case *policyRecord:
		delete(f.invalid, r.key())
		f.model.DeletePolicy(r.key())
	case *clusterPolicyRecord:
		delete(f.clusterReported, r.meta.Name)
		f.model.DeleteClusterPolicy(r.meta.Name)
	case *Node:
		f.model.DeleteNode(r.Name)
	}
}

// denyChains are the chains whose counters count denied packets, by
// direction, for the metric.
func (f *Feature) denyChains(d Direction) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.model.denyChains(d)
}
