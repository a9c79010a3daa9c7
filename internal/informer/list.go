package informer

import (
	"context"
	"errors"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/netplane/netplane/internal/outage"
)

// listPageSize bounds how many whole objects a list holds decoded at once.
const listPageSize = 500

// listWatch lists and watches one resource for a reflector, with the
// selectors (nil: none) sent to the API server, keeping of each listed
// object only what keep returns (nil: nothing). A reflector's own list
// would first decode the whole list, which for the pods of a large cluster
// is hundreds of megabytes at once, however little of it the store keeps.
// Watch events still carry whole objects, one at a time.
//
// Every request goes through m, the informer's place at the process's
// outage gate (resume.go).
//
// c is the client list and watchFn call through, which says whether the
// API server may stream the first list as a watch.
func listWatch(c any, m *outage.Member, list listFunc, watchFn watchFunc, ls labels.Selector, fs fields.Selector, keep func(runtime.Object) any) cache.ListerWatcher {
	narrow := func(o *metav1.ListOptions) {
		if ls != nil && !ls.Empty() {
			o.LabelSelector = ls.String()
		}
		if fs != nil && !fs.Empty() {
			o.FieldSelector = fs.String()
		}
	}
	return cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			narrow(&o)
			var l *slimList
			err := m.Do(ctx, func() (err error) {
				l, err = pagedList(ctx, o, list, keep)
				return err
			})
			if err != nil {
				return nil, err
			}
			return l, nil
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			narrow(&o)
			var w watch.Interface
			err := m.Do(ctx, func() (err error) {
				w, err = watchFn(ctx, o)
				return err
			})
			if err != nil {
				return nil, err
			}
			return watchThrough(m, w), nil
		},
	}, c)
}

// listed carries a record that is no runtime.Object through a reflector's
// list, whose items must be; the transform (transformFunc) or the sink
// unwraps it. A record that is one goes as it is, without the wrapper's
// allocation (50,000 pods: 800 kB at the peak of the first list).
type listed struct{ rec any }

func (l *listed) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }
func (l *listed) DeepCopyObject() runtime.Object   { return l } // records are never changed

// slimList is a list of slimmed objects, as a reflector reads lists.
type slimList struct {
	metav1.ListMeta
	Items []runtime.Object
}

func (l *slimList) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

func (l *slimList) DeepCopyObject() runtime.Object {
	c := *l
	c.Items = append([]runtime.Object(nil), l.Items...)
	return &c
}

// pagedList lists page by page, keeping of each object what keep returns.
// A list at any version ("0") is answered by the API server from its cache
// in one piece whatever the limit, so it becomes a paged list of the
// current state, which is at least as fresh.
func pagedList(ctx context.Context, o metav1.ListOptions, list listFunc, keep func(runtime.Object) any) (*slimList, error) {
	if o.ResourceVersion == "0" {
		o.ResourceVersion, o.ResourceVersionMatch = "", ""
	}
	o.Limit = listPageSize
	out := &slimList{}
	for {
		page, err := list(ctx, o)
		if err != nil {
			return nil, err
		}
		err = meta.EachListItem(page, func(obj runtime.Object) error {
			switch k := keep(obj).(type) {
			case nil:
			case runtime.Object: // a record the transform or the sink passes as it is
				out.Items = append(out.Items, k)
			default:
				out.Items = append(out.Items, &listed{k})
			}
			return nil
		})
		lm, merr := meta.ListAccessor(page)
		if err != nil || merr != nil {
			return nil, errors.Join(err, merr)
		}
		out.ResourceVersion = lm.GetResourceVersion()
		if lm.GetContinue() == "" {
			return out, nil
		}
		o.Continue, o.ResourceVersion, o.ResourceVersionMatch = lm.GetContinue(), "", ""
	}
}
