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
// A ListSink view's store (stream, nil for any other) takes each list's
// records as they arrive, a page or an initial event at a time, and the
// reflector is handed none.
//
// Every request goes through m, the informer's place at the process's
// outage gate (resume.go).
//
// c is the client list and watchFn call through, which says whether the
// API server may stream the first list as a watch.
func listWatch(c any, m *outage.Member, list listFunc, watchFn watchFunc, ls labels.Selector, fs fields.Selector, keep func(runtime.Object) any, stream *sinkStore) cache.ListerWatcher {
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
				if stream != nil {
					l, err = streamedList(ctx, o, list, stream)
				} else {
					l, err = pagedList(ctx, o, list, keep)
				}
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
			w = watchThrough(m, w)
			if stream != nil && o.SendInitialEvents != nil && *o.SendInitialEvents {
				w = stream.initialEvents(w)
			}
			return w, nil
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
func pagedList(ctx context.Context, o metav1.ListOptions, list listFunc, keep func(runtime.Object) any) (*slimList, error) {
	out := &slimList{}
	rv, err := pages(ctx, o, list, keep, func(rec any) {
		switch k := rec.(type) {
		case runtime.Object: // a record the transform or the sink passes as it is
			out.Items = append(out.Items, k)
		default:
			out.Items = append(out.Items, &listed{k})
		}
	})
	if err != nil {
		return nil, err
	}
	out.ResourceVersion = rv
	return out, nil
}

// streamedList lists page by page into a ListSink's store, each page
// applied before the next is asked for, and hands the reflector a list of
// nothing but the version: its Replace then closes the sink's list.
func streamedList(ctx context.Context, o metav1.ListOptions, list listFunc, s *sinkStore) (*slimList, error) {
	n := s.begin()
	rv, err := pages(ctx, o, list, s.h.record, func(rec any) { s.listed(n, rec, s.stream.Add) })
	if err != nil {
		return nil, err
	}
	return &slimList{ListMeta: metav1.ListMeta{ResourceVersion: rv}}, nil
}

// pages lists page by page, handing take what keep returns of each object
// (nothing when nil), and returns the list's version. A list at any
// version ("0") is answered by the API server from its cache in one piece
// whatever the limit, so it becomes a paged list of the current state,
// which is at least as fresh. Every page is of one snapshot: an object
// created or deleted meanwhile is a watch event after the list.
func pages(ctx context.Context, o metav1.ListOptions, list listFunc, keep func(runtime.Object) any, take func(rec any)) (string, error) {
	if o.ResourceVersion == "0" {
		o.ResourceVersion, o.ResourceVersionMatch = "", ""
	}
	o.Limit = listPageSize
	for {
		page, err := list(ctx, o)
		if err != nil {
			return "", err
		}
		err = meta.EachListItem(page, func(obj runtime.Object) error {
			if rec := keep(obj); rec != nil {
				take(rec)
			}
			return nil
		})
		lm, merr := meta.ListAccessor(page)
		if err != nil || merr != nil {
			return "", errors.Join(err, merr)
		}
		if lm.GetContinue() == "" {
			return lm.GetResourceVersion(), nil
		}
		o.Continue, o.ResourceVersion, o.ResourceVersionMatch = lm.GetContinue(), "", ""
	}
}
