package policy

import (
	"context"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	cnpclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned/typed/apis/v1beta1"
)

// The ClusterNetworkPolicy CRD may be installed, upgraded or removed while
// the node role runs, and operators expect enforcement to follow without a
// restart. The role watches that one CRD by name (a field selector, which
// its RBAC grant's resourceNames requires): the API server tells it within
// a round trip, a watch of one object costs nothing between changes, and
// the CRD's status says when the API server serves the resource
// (Established), which discovery would only say if asked again and again.
// While the CRD serves v1beta1, a reflector of the policies runs; when it
// stops serving it (deleted, being deleted, v1beta1 no longer served), the
// reflector stops and its policies leave the model in one step, so the
// table becomes NetworkPolicy's again in one sync and NetworkPolicy's
// rules are never touched. Both watches pass the informer layer's outage
// gate: an outage or relist keeps the policies last read.

// crdName is the ClusterNetworkPolicy CRD's name.
var crdName = ClusterPolicyResource.GroupResource().String()

// crdResource is what the CRD is, for errors.
var crdResource = apiextensionsv1.SchemeGroupVersion.WithResource("customresourcedefinitions")

// crdRecord is what the node reads of the CRD.
type crdRecord struct {
	meta   metav1.ObjectMeta
	served bool // it serves ClusterPolicyResource now (crdServes)
}

// GetObjectMeta is the record's key, for the informer layer.
func (r *crdRecord) GetObjectMeta() metav1.Object { m := r.meta; return &m }

func crdRecordOf(crd *apiextensionsv1.CustomResourceDefinition) *crdRecord {
	return &crdRecord{meta: metav1.ObjectMeta{Name: crd.Name, ResourceVersion: crd.ResourceVersion}, served: crdServes(crd)}
}

// crdServes reports whether crd has the API server serve
// ClusterPolicyResource: it is established, serves that version, and is
// not being deleted (its deletion deletes every policy first).
func crdServes(crd *apiextensionsv1.CustomResourceDefinition) bool {
	if crd.Name != crdName || crd.DeletionTimestamp != nil {
		return false
	}
	established := false
	for _, c := range crd.Status.Conditions {
		if c.Type == apiextensionsv1.Established {
			established = c.Status == apiextensionsv1.ConditionTrue
		}
	}
	for _, v := range crd.Spec.Versions {
		if v.Name == ClusterPolicyResource.Version {
			return established && v.Served
		}
	}
	return false
}

// crdWatch is the CRD watch's sink: it starts the policies' reflector when
// the CRD serves them and stops it when it no longer does. It is done
// (cache.DoneChecker) once the CRD was listed and, if it was served then,
// the policies too: the first sync must see them. The reflector calls it
// one write at a time.
type crdWatch struct {
	e        *Feature
	ctx      context.Context // Run's
	policies cnpclient.PolicyV1beta1Interface

	run    context.Context    // the policies' reflector's life
	stop   context.CancelFunc // ends it; nil while not served
	sink   *sink              // that reflector's sink, closed when it stops
	listed bool               // the CRD was listed once
	synced chan struct{}
}

func (w *crdWatch) Add(obj any) error    { w.set(served(obj)); return nil }
func (w *crdWatch) Update(obj any) error { w.set(served(obj)); return nil }
func (w *crdWatch) Delete(any) error     { w.set(false); return nil }
func (w *crdWatch) Resync() error        { return nil }

// Replace is a (re)list: the CRD is served if a record listed says so.
func (w *crdWatch) Replace(list []any, _ string) error {
	on := false
	for _, obj := range list {
		on = on || served(obj)
	}
	first := !w.listed
	w.listed = true
	listed := w.set(on)
	if !first {
		return nil
	}
	if !on {
		w.e.log.Info("the ClusterNetworkPolicy CRD is not installed: enforcing NetworkPolicy only", "resource", ClusterPolicyResource.String())
		close(w.synced)
		return nil
	}
	go func(run context.Context) {
		select {
		case <-listed.Done():
		case <-run.Done(): // no longer served before its policies were listed
		}
		close(w.synced)
	}(w.run)
	return nil
}

func served(obj any) bool {
	r, ok := obj.(*crdRecord)
	return ok && r.served
}

// set starts or stops the policies' reflector as the CRD is served or not,
// and returns what says the reflector it started listed them (nil when it
// started none).
func (w *crdWatch) set(on bool) cache.DoneChecker {
	switch {
	case on && w.stop == nil:
		w.run, w.stop = context.WithCancel(w.ctx)
		w.sink = &sink{e: w.e, kind: clusterPolicies}
		w.e.log.Info("the ClusterNetworkPolicy CRD is served: enforcing ClusterNetworkPolicy", "resource", ClusterPolicyResource.String())
		return w.e.runPolicies(w.run, w.policies, w.sink)
	case !on && w.stop != nil:
		w.stop()
		w.stop = nil
		e := w.e
		e.mu.Lock()
		w.sink.closed = true // a write the reflector was handing on is dropped
		for _, r := range e.records(clusterPolicies) {
			e.remove(r)
		}
		clear(e.clusterReported) // with the policies that never compiled
		e.mu.Unlock()
		e.loop.Request()
		e.log.Info("the ClusterNetworkPolicy CRD is no longer served: enforcing NetworkPolicy only", "resource", ClusterPolicyResource.String())
	}
	return nil
}

// Name and Done make the watch a cache.DoneChecker.
func (w *crdWatch) Name() string          { return "network-policy " + crdName }
func (w *crdWatch) Done() <-chan struct{} { return w.synced }
