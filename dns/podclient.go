package dns

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	clientscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/watchlist"
)

// podClient lists and watches pods as protobuf through the wire reader
// (podwire.go), over the connection of the role's own client.
type podClient struct {
	rc *rest.RESTClient
	// noWatchList: the role's client says it cannot stream a first list
	// as a watch, so neither can this one.
	noWatchList bool
}

// IsWatchListSemanticsUnSupported tells client-go's reflector whether the
// first list may be a watch.
func (c *podClient) IsWatchListSemanticsUnSupported() bool { return c.noWatchList }

// newPodClient returns a podClient sharing c's connection, rate limiter
// and credentials, or nil when c has no REST client (a fake clientset's),
// whose pods are then read as Pods.
func newPodClient(c kubernetes.Interface) (*podClient, error) {
	core, ok := c.CoreV1().RESTClient().(*rest.RESTClient)
	if !ok || core == nil {
		return nil, nil
	}
	std, ok := runtime.SerializerInfoForMediaType(clientscheme.Codecs.WithoutConversion().SupportedMediaTypes(), runtime.ContentTypeProtobuf)
	if !ok {
		return nil, errors.New("client-go has no protobuf serializer")
	}
	// The watch's frames are read as client-go reads them; the objects in
	// them, and list and get bodies, by podDecoder.
	info := std
	info.Serializer = podDecoder{std: std.Serializer}
	gv := corev1.SchemeGroupVersion
	rc, err := rest.NewRESTClient(core.Get().AbsPath("/").URL(), "/api/v1", rest.ClientContentConfig{
		AcceptContentTypes: runtime.ContentTypeProtobuf,
		ContentType:        runtime.ContentTypeProtobuf,
		GroupVersion:       gv,
		Negotiator:         runtime.NewClientNegotiator(podCodecs{info}, gv),
	}, core.GetRateLimiter(), core.Client)
	if err != nil {
		return nil, fmt.Errorf("a client of pods: %w", err)
	}
	return &podClient{rc: rc, noWatchList: watchlist.DoesClientNotSupportWatchListSemantics(c)}, nil
}

func (c *podClient) list(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
	return c.rc.Get().Resource("pods").VersionedParams(&o, clientscheme.ParameterCodec).Do(ctx).Get()
}

func (c *podClient) watch(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	var timeout time.Duration
	if o.TimeoutSeconds != nil {
		timeout = time.Duration(*o.TimeoutSeconds) * time.Second
	}
	o.Watch = true
	return c.rc.Get().Resource("pods").VersionedParams(&o, clientscheme.ParameterCodec).Timeout(timeout).Watch(ctx)
}

// podDecoder decodes Pods and PodLists with the wire reader and anything
// else (an error's Status) with client-go's protobuf serializer.
type podDecoder struct{ std runtime.Serializer }

func (d podDecoder) Decode(data []byte, gvk *schema.GroupVersionKind, into runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	obj, err := decodePodWire(data)
	switch {
	case errors.Is(err, errNotPods):
		return d.std.Decode(data, gvk, into)
	case err != nil:
		return nil, nil, err
	}
	kind := "Pod"
	if _, ok := obj.(*podInfoList); ok {
		kind = "PodList"
	}
	return obj, &schema.GroupVersionKind{Version: "v1", Kind: kind}, nil
}

func (d podDecoder) Encode(obj runtime.Object, w io.Writer) error { return d.std.Encode(obj, w) }

func (d podDecoder) Identifier() runtime.Identifier { return "netplane-dns-pods" }

// podCodecs offers podDecoder, protobuf only: the API server serves
// every core resource in it.
type podCodecs struct{ info runtime.SerializerInfo }

func (c podCodecs) SupportedMediaTypes() []runtime.SerializerInfo {
	return []runtime.SerializerInfo{c.info}
}

func (c podCodecs) EncoderForVersion(e runtime.Encoder, _ runtime.GroupVersioner) runtime.Encoder {
	return e
}

func (c podCodecs) DecoderToVersion(d runtime.Decoder, _ runtime.GroupVersioner) runtime.Decoder {
	return d
}
