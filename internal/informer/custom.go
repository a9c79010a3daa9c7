package informer

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/netplane/netplane/internal/outage"
)

// Custom is a resource the factory's clientset does not serve (a custom
// resource, or the CustomResourceDefinitions), read into a sink for as
// long as its reader wants: its CRD may come and go while the process
// runs, so it is not registered with the factory but run on its own
// (RunCustom), through the same gate as the factory's informers.
type Custom struct {
	// Kind names the resource at the gate and in logs; Name says who
	// reads it, as View.Name does.
	Kind Kind
	Name string
	// Example is an object of the resource's type.
	Example runtime.Object
	// List and Watch call the API server, through a client whose transport
	// passes the gate (outage.Gate.Config); Client is that client, which
	// says whether it can stream a first list as a watch.
	List   func(context.Context, metav1.ListOptions) (runtime.Object, error)
	Watch  func(context.Context, metav1.ListOptions) (watch.Interface, error)
	Client any
	// Fields, Record and Sink are a lone sink view's (View): the selector
	// is sent to the API server, which applies it.
	Fields fields.Selector
	Record func(obj runtime.Object) any
	Sink   cache.ReflectorStore
}

// RunCustom lists and watches c into its sink until ctx ends, as a lone
// sink view of the factory is read: paged lists slimmed page by page, and
// through an API server outage by the factory's gate, so the sink keeps
// what it last had until the relist. The checker is done once the first
// list reached the sink.
func (f *Factory) RunCustom(ctx context.Context, c Custom) cache.DoneChecker {
	def := kind{example: c.Example, fields: metaFields}
	h := &Handle{view: View{Kind: c.Kind, Name: c.Name, Fields: c.Fields, Record: c.Record, Sink: c.Sink},
		res: &resource{kind: c.Kind, def: def, started: true}, alone: true}
	h.res.views = []*Handle{h}
	m := f.gate.Member(ctx, string(c.Kind))
	return runSink(ctx, h, m, func(stream *sinkStore) cache.ListerWatcher {
		return listWatch(c.Client, m, c.List, c.Watch, nil, c.Fields, h.record, stream)
	})
}

// runSink runs the reflector of a lone sink view h until ctx ends, then
// leaves the gate, and returns what says it handed the sink its first list.
func runSink(ctx context.Context, h *Handle, m *outage.Member, lw func(stream *sinkStore) cache.ListerWatcher) cache.DoneChecker {
	s := newSinkStore(h)
	var stream *sinkStore // a ListSink's store takes each list as it arrives
	if s.stream != nil {
		stream = s
	}
	rf := cache.NewReflectorWithOptions(lw(stream), h.res.def.example, s, cache.ReflectorOptions{Name: h.view.Name + " " + string(h.view.Kind)})
	go func() {
		runReflector(ctx, rf, m)
		m.Leave() // an outage under way no longer waits for it
	}()
	return s
}
