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
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/internal/informer"
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
// that one. It is the sink of that watch.
type configMapWatch struct {
	ns, name string
	apply    func(data map[string]string) error
	metrics  *metrics
	log      logr.Logger
	synced   cache.DoneChecker    // set by followKubeDNS
	recorder record.EventRecorder // set by followKubeDNS
	// version is the resourceVersion last handed to apply, "" while none
	// is: a relist after an API server outage that finds the ConfigMap
	// unchanged applies nothing.
	version string
}

// followKubeDNS applies the ConfigMap ns/name through apply on every
// change until ctx ends; a deleted ConfigMap applies as empty. A ConfigMap
// apply refuses is reported where its author looks (a Warning event on
// it, written through events), in the log and in a metric, and the last
// good one stays in force. The watch is one of f's readers, so through an
// API server outage it waits at f's gate as every informer of the process
// does, rather than asking every second.
func followKubeDNS(ctx context.Context, f *informer.Factory, events kubernetes.Interface, w *configMapWatch) {
	cms := f.Client().CoreV1().ConfigMaps(w.ns)
	b := record.NewBroadcaster(record.WithContext(ctx))
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: events.CoreV1().Events("")})
	w.recorder = b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "netplane-dns"})
	w.synced = f.RunCustom(ctx, informer.Custom{Kind: "configmaps", Name: "dns", Example: &corev1.ConfigMap{}, Client: cms,
		List:   func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return cms.List(ctx, o) },
		Watch:  cms.Watch,
		Fields: fields.OneTermEqualSelector("metadata.name", w.name),
		Record: func(o runtime.Object) any { return o },
		Sink:   w})
	go func() {
		<-ctx.Done()
		b.Shutdown()
	}()
}

func (w *configMapWatch) Add(obj any) error    { w.changed(obj, false); return nil }
func (w *configMapWatch) Update(obj any) error { w.changed(obj, false); return nil }
func (w *configMapWatch) Delete(obj any) error { w.changed(obj, true); return nil }
func (w *configMapWatch) Resync() error        { return nil }

// Replace is a (re)list: the ConfigMap it holds, or a deletion of the one
// applied when it holds none.
func (w *configMapWatch) Replace(list []any, _ string) error {
	switch {
	case len(list) > 0: // the selector lets one through at most
		if cm, ok := list[0].(*corev1.ConfigMap); ok && cm.ResourceVersion != w.version {
			w.changed(cm, false)
		}
	case w.version != "":
		w.changed(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: w.name}}, true)
	}
	return nil
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
	w.version = cm.ResourceVersion
	if deleted {
		w.version = ""
	}
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
