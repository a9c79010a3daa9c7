package dns

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/netplane/netplane/apis/config/v1alpha1"
)

// The kube-dns ConfigMap's keys, as Kubernetes documents them for clusters
// that customise kube-dns. Its obsolete "federations" key is ignored.
const (
	keyStubDomains         = "stubDomains"
	keyUpstreamNameservers = "upstreamNameservers"
	// kube-dns takes at most three upstream servers, resolv.conf's limit.
	maxUpstreamNameservers = 3
)

// parseKubeDNS reads a kube-dns ConfigMap's data: stubDomains, a JSON
// object of domain to its servers; upstreamNameservers, a JSON list of at
// most three servers, each an IP or IP:port. An absent or empty key sets
// nothing. The error names every key that is wrong and how; a ConfigMap
// with an error is not applied at all, as half of it could send a
// domain's names where its owner did not mean.
func parseKubeDNS(data map[string]string, clusterDomain string) (forwarding, error) {
	var fw forwarding
	var errs field.ErrorList
	stubsPath, upPath := field.NewPath("data", keyStubDomains), field.NewPath("data", keyUpstreamNameservers)
	if s := strings.TrimSpace(data[keyStubDomains]); s != "" {
		if err := json.Unmarshal([]byte(s), &fw.stubs); err != nil {
			fw.stubs = nil // what did decode is no setting
			errs = append(errs, field.Invalid(stubsPath, field.OmitValueType{},
				`must be a JSON object of domain to list of servers, like {"corp.example": ["10.0.0.53"]}: `+err.Error()))
		}
	}
	if s := strings.TrimSpace(data[keyUpstreamNameservers]); s != "" {
		if err := json.Unmarshal([]byte(s), &fw.upstreams); err != nil {
			fw.upstreams = nil
			errs = append(errs, field.Invalid(upPath, field.OmitValueType{},
				`must be a JSON list of servers, like ["10.0.0.53", "10.0.0.54:5353"]: `+err.Error()))
		} else if len(fw.upstreams) > maxUpstreamNameservers {
			errs = append(errs, field.Invalid(upPath, field.OmitValueType{},
				fmt.Sprintf("lists %d servers, at most %d are allowed", len(fw.upstreams), maxUpstreamNameservers)))
		}
	}
	errs = append(errs, v1alpha1.ValidateForwarding(clusterDomain, fw.stubs, fw.upstreams, stubsPath, upPath)...)
	if len(errs) > 0 {
		return forwarding{}, v1alpha1.ErrorOf(errs)
	}
	return fw, nil
}

// merge is the forwarding a server runs from its file's settings and the
// kube-dns ConfigMap's: the ConfigMap's stub domain wins for a domain both
// name; the ConfigMap's upstream servers replace the file's when it lists
// any; with neither, resolv.conf's nameservers.
func merge(file, cm forwarding, resolv []string) forwarding {
	out := forwarding{stubs: map[string][]string{}, upstreams: resolv}
	for _, src := range []forwarding{file, cm} {
		for d, servers := range src.stubs {
			out.stubs[v1alpha1.StubDomain(d)] = servers
		}
		if len(src.upstreams) > 0 {
			out.upstreams = src.upstreams
		}
	}
	return out
}

// configMapWatch follows one ConfigMap through a watch selecting it by name,
// so the server reads no other ConfigMap and needs the right to read only
// that one.
type configMapWatch struct {
	ns, name string
	apply    func(data map[string]string) error
	metrics  *metrics
	log      logr.Logger
	synced   cache.DoneChecker    // set by followKubeDNS
	recorder record.EventRecorder // set by followKubeDNS
}

// followKubeDNS applies the ConfigMap ns/name through apply on every
// change until ctx ends; a deleted ConfigMap applies as empty. A ConfigMap
// apply refuses is reported where its author looks (a Warning event on
// it), in the log and in a metric, and the last good one stays in force.
func followKubeDNS(ctx context.Context, client kubernetes.Interface, w *configMapWatch) {
	byName := fields.OneTermEqualSelector("metadata.name", w.name).String()
	cms := client.CoreV1().ConfigMaps(w.ns)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = byName
			return cms.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = byName
			return cms.Watch(ctx, o)
		},
	}
	_, ctrl := cache.NewInformerWithOptions(cache.InformerOptions{ListerWatcher: lw, ObjectType: &corev1.ConfigMap{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { w.changed(obj, false) },
			UpdateFunc: func(_, obj any) { w.changed(obj, false) },
			DeleteFunc: func(obj any) { w.changed(obj, true) },
		}})
	w.synced = ctrl.HasSyncedChecker()
	events := record.NewBroadcaster(record.WithContext(ctx))
	events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	w.recorder = events.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "netplane-dns"})
	go func() {
		ctrl.RunWithContext(ctx)
		events.Shutdown()
	}()
}

func (w *configMapWatch) changed(obj any, deleted bool) {
	cm, ok := unwrap(obj).(*corev1.ConfigMap)
	if !ok {
		return
	}
	data := cm.Data
	if deleted {
		data = nil
	}
	err := w.apply(data)
	if err == nil {
		w.log.Info("applied the kube-dns ConfigMap", "configMap", w.ns+"/"+w.name, "resourceVersion", cm.ResourceVersion, "deleted", deleted)
		return
	}
	msg := strings.ReplaceAll(err.Error(), "\n", "; ")
	w.log.Error(errors.New(msg), "the kube-dns ConfigMap is invalid; the last valid one stays in force", "configMap", w.ns+"/"+w.name, "resourceVersion", cm.ResourceVersion)
	w.metrics.rejectedConfig("configmap")
	w.recorder.Eventf(cm, corev1.EventTypeWarning, "InvalidDNSConfig", "Not applied, the last valid configuration stays in force: %s", msg)
}

func (w *configMapWatch) ready() error {
	if w == nil || w.synced == nil {
		return nil
	}
	select {
	case <-w.synced.Done():
		return nil
	default:
		return fmt.Errorf("the kube-dns ConfigMap %s/%s has not been read yet", w.ns, w.name)
	}
}
