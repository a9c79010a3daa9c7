package informer

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
)

// name is a record of a test: a Service's name, tagged by its view.
type name struct {
	meta metav1.ObjectMeta
	tag  string
}

func (n *name) GetObjectMeta() metav1.Object { return &n.meta }

func tagged(tag string) func(runtime.Object) any {
	return func(o runtime.Object) any {
		s := o.(*corev1.Service)
		return &name{meta: metav1.ObjectMeta{Namespace: s.Namespace, Name: s.Name, ResourceVersion: s.ResourceVersion}, tag: tag}
	}
}

func svc(ns, n string, lbls map[string]string) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: n, Labels: lbls}}
}

// events records what a handler saw, as "add ns/name tag" lines.
type events struct {
	mu    sync.Mutex
	lines []string
}

func (e *events) line(verb string, obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	var s string
	switch o := obj.(type) {
	case *name:
		s = fmt.Sprintf("%s %s/%s %s", verb, o.meta.Namespace, o.meta.Name, o.tag)
	case *corev1.Service:
		s = fmt.Sprintf("%s %s/%s whole", verb, o.Namespace, o.Name)
	default:
		s = fmt.Sprintf("%s %T", verb, obj)
	}
	e.mu.Lock()
	e.lines = append(e.lines, s)
	e.mu.Unlock()
}

func (e *events) handler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { e.line("add", o) },
		UpdateFunc: func(_, o any) { e.line("update", o) },
		DeleteFunc: func(o any) { e.line("delete", o) },
	}
}

func (e *events) waitFor(t *testing.T, want ...string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 5*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		e.mu.Lock()
		defer e.mu.Unlock()
		return slices.Equal(e.lines, want), nil
	})
	if err != nil {
		e.mu.Lock()
		defer e.mu.Unlock()
		t.Fatalf("events:\n got %q\nwant %q", e.lines, want)
	}
}

func start(t *testing.T, f *Factory, hs ...*Handle) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	f.Start(ctx)
	var checks []cache.DoneChecker
	for _, h := range hs {
		checks = append(checks, h.Synced())
	}
	if !cache.WaitFor(ctx, "", checks...) {
		t.Fatal("views did not sync")
	}
}

// watching is told when the fake's watch of resource has started: a change
// made before would never reach the informer.
func watching(c *fake.Clientset, resource string) <-chan struct{} {
	ch := make(chan struct{}, 1)
	c.PrependWatchReactor(resource, func(a k8stesting.Action) (bool, watch.Interface, error) {
		w, err := c.Tracker().Watch(a.GetResource(), a.GetNamespace())
		select {
		case ch <- struct{}{}:
		default:
		}
		return true, w, err
	})
	return ch
}

// listsAndWatches counts the client's list and watch calls per resource.
func listsAndWatches(c *fake.Clientset) map[string]int {
	out := map[string]int{}
	for _, a := range c.Actions() {
		if a.GetVerb() == "list" || a.GetVerb() == "watch" {
			out[a.GetVerb()+" "+a.GetResource().Resource]++
		}
	}
	return out
}

func keys(objs []any) []string {
	var out []string
	for _, o := range objs {
		k, _ := cache.MetaNamespaceKeyFunc(o)
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func TestALoneViewKeepsItsRecordsAndSendsItsSelectorToTheServer(t *testing.T) {
	c := fake.NewClientset(svc("a", "x", nil), svc("a", "headless", map[string]string{"headless": ""}))
	f := New(c)
	sel, _ := labels.Parse("!headless")
	h := f.Register(View{Kind: Services, Name: "proxy", Labels: sel, Record: tagged("proxy")})
	var ev events
	start(t, f, h)
	if _, err := h.AddEventHandler(ev.handler()); err != nil {
		t.Fatal(err)
	}
	ev.waitFor(t, "add a/x proxy")
	if got := keys(h.Indexer().List()); !slices.Equal(got, []string{"a/x"}) {
		t.Errorf("store holds %v, want [a/x]", got)
	}
	for _, a := range c.Actions() {
		if l, ok := a.(k8stesting.ListAction); ok && l.GetListRestrictions().Labels.String() != "!headless" {
			t.Errorf("list sent label selector %q, want !headless", l.GetListRestrictions().Labels)
		}
	}
}

func TestViewsOfOneResourceShareOneListAndWatch(t *testing.T) {
	c := fake.NewClientset(svc("a", "x", nil), svc("a", "headless", map[string]string{"headless": ""}))
	f := New(c)
	sel, _ := labels.Parse("!headless")
	whole := f.Register(View{Kind: Services, Name: "controller"})
	proxy := f.Register(View{Kind: Services, Name: "proxy", Labels: sel, Record: tagged("proxy")})
	dns := f.Register(View{Kind: Services, Name: "dns", Record: tagged("dns")})
	watched := watching(c, "services")
	start(t, f, whole, proxy, dns)
	// The views sync after the list; the watch starts just after that.
	select {
	case <-watched:
	case <-time.After(10 * time.Second):
		t.Fatal("services never watched")
	}
	if got := listsAndWatches(c); got["list services"] != 1 || got["watch services"] != 1 {
		t.Errorf("calls %v, want one list and one watch of services", got)
	}
	for _, tc := range []struct {
		h    *Handle
		want []string
		typ  string
	}{
		{whole, []string{"a/headless", "a/x"}, "*v1.Service"},
		{proxy, []string{"a/x"}, "*informer.name"},
		{dns, []string{"a/headless", "a/x"}, "*informer.name"},
	} {
		objs := tc.h.Indexer().List()
		if got := keys(objs); !slices.Equal(got, tc.want) {
			t.Errorf("%s sees %v, want %v", tc.h.view.Name, got, tc.want)
		}
		for _, o := range objs {
			if got := fmt.Sprintf("%T", o); got != tc.typ {
				t.Errorf("%s sees a %s, want %s", tc.h.view.Name, got, tc.typ)
			}
		}
	}
	// A typed lister works on a whole view's window.
	got, err := corelisters.NewServiceLister(whole.Indexer()).Services("a").List(labels.Everything())
	if err != nil || len(got) != 2 {
		t.Errorf("lister listed %d Services (%v), want 2", len(got), err)
	}
	if _, ok, _ := proxy.Indexer().GetByKey("a/headless"); ok {
		t.Error("the proxy's view holds a Service its selector excludes")
	}
}

func TestAnObjectEnteringOrLeavingAViewIsAnAddOrADeleteForThatViewOnly(t *testing.T) {
	c := fake.NewClientset(svc("a", "x", nil))
	f := New(c)
	sel, _ := labels.Parse("!headless")
	proxy := f.Register(View{Kind: Services, Name: "proxy", Labels: sel, Record: tagged("proxy")})
	dns := f.Register(View{Kind: Services, Name: "dns", Record: tagged("dns")})
	watched := watching(c, "services")
	start(t, f, proxy, dns)
	<-watched
	var pev, dev events
	_, _ = proxy.AddEventHandler(pev.handler())
	_, _ = dns.AddEventHandler(dev.handler())
	pev.waitFor(t, "add a/x proxy")
	ctx := context.Background()
	set := func(s *corev1.Service) {
		if _, err := c.CoreV1().Services("a").Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	set(svc("a", "x", map[string]string{"headless": ""}))
	set(svc("a", "x", map[string]string{"headless": "", "other": "1"}))
	set(svc("a", "x", nil))
	if err := c.CoreV1().Services("a").Delete(ctx, "x", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	pev.waitFor(t, "add a/x proxy", "delete a/x proxy", "add a/x proxy", "delete a/x proxy")
	dev.waitFor(t, "add a/x dns", "update a/x dns", "update a/x dns", "update a/x dns", "delete a/x dns")
}

func TestViewIndexesAnswerWithTheViewsRecords(t *testing.T) {
	byTag := cache.Indexers{"tag": func(o any) ([]string, error) { return []string{o.(*name).tag + "/" + o.(*name).meta.Name}, nil }}
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprintf("shared=%v", shared), func(t *testing.T) {
			c := fake.NewClientset(svc("a", "x", nil), svc("b", "y", nil))
			f := New(c)
			h := f.Register(View{Kind: Services, Name: "dns", Record: tagged("dns"), Indexers: byTag})
			if shared {
				f.Register(View{Kind: Services, Name: "controller"})
			}
			start(t, f, h)
			got, err := h.Indexer().ByIndex("tag", "dns/y")
			if err != nil || keys(got) == nil || keys(got)[0] != "b/y" {
				t.Errorf("ByIndex(tag, dns/y) = %v, %v; want [b/y]", keys(got), err)
			}
			got, _ = h.Indexer().ByIndex(cache.NamespaceIndex, "a")
			if k := keys(got); !slices.Equal(k, []string{"a/x"}) {
				t.Errorf("namespace index a = %v, want [a/x]", k)
			}
		})
	}
}

// addrSink is a sink of a test: it records what it is told.
type addrSink struct {
	events
	cache.Store // unused methods
}

func (s *addrSink) Add(o any) error    { s.line("add", o); return nil }
func (s *addrSink) Update(o any) error { s.line("update", o); return nil }
func (s *addrSink) Delete(o any) error { s.line("delete", o); return nil }
func (s *addrSink) Replace(l []any, _ string) error {
	for _, o := range l {
		s.line("replace", o)
	}
	return nil
}

func TestASinkViewIsToldOfRecordsAloneAndBesideAStoredView(t *testing.T) {
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprintf("shared=%v", shared), func(t *testing.T) {
			c := fake.NewClientset(svc("a", "x", nil))
			f := New(c)
			sink := &addrSink{}
			h := f.Register(View{Kind: Services, Name: "dns", Record: tagged("dns"), Sink: sink})
			if shared {
				f.Register(View{Kind: Services, Name: "controller"})
			}
			watched := watching(c, "services")
			start(t, f, h)
			<-watched
			first := "replace a/x dns"
			if shared {
				first = "add a/x dns"
			}
			sink.waitFor(t, first)
			if _, err := c.CoreV1().Services("a").Create(context.Background(), svc("a", "y", nil), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			if err := c.CoreV1().Services("a").Delete(context.Background(), "x", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			sink.waitFor(t, first, "add a/y dns", "delete a/x dns")
		})
	}
}

func TestRegisteringAViewAfterItsResourceStartedPanics(t *testing.T) {
	f := New(fake.NewClientset())
	h := f.Register(View{Kind: Services, Name: "controller"})
	start(t, f, h)
	defer func() {
		if recover() == nil {
			t.Error("a late view was accepted")
		}
	}()
	f.Register(View{Kind: Services, Name: "late"})
}

func TestAViewWithoutTheNamespaceIndexHasOnlyItsOwnIndexes(t *testing.T) {
	byTag := cache.Indexers{"tag": func(o any) ([]string, error) { return []string{o.(*name).tag}, nil }}
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprintf("shared=%v", shared), func(t *testing.T) {
			f := New(fake.NewClientset(svc("a", "x", nil)))
			h := f.Register(View{Kind: Services, Name: "dns", Record: tagged("dns"), Indexers: byTag, NoNamespaceIndex: true})
			if shared {
				f.Register(View{Kind: Services, Name: "controller"})
			}
			start(t, f, h)
			var names []string
			for n := range h.Indexer().GetIndexers() {
				names = append(names, n)
			}
			if !slices.Equal(names, []string{"tag"}) {
				t.Errorf("indexes %v, want [tag] alone", names)
			}
			if got, err := h.Indexer().ByIndex("tag", "dns"); err != nil || !slices.Equal(keys(got), []string{"a/x"}) {
				t.Errorf("ByIndex(tag, dns) = %v, %v; want [a/x]", keys(got), err)
			}
		})
	}
}

func TestAFieldSelectorIsAppliedHereForASharedResource(t *testing.T) {
	c := fake.NewClientset(testPod("running", corev1.PodRunning, "10.0.0.1"), testPod("done", corev1.PodSucceeded))
	f := New(c)
	running := f.Register(View{Kind: Pods, Name: "dns", Fields: fields.AndSelectors(
		fields.OneTermNotEqualSelector("status.phase", string(corev1.PodSucceeded)),
		fields.OneTermEqualSelector("metadata.namespace", "ns"))})
	all := f.Register(View{Kind: Pods, Name: "controller"})
	start(t, f, running, all)
	if got := keys(running.Indexer().List()); !slices.Equal(got, []string{"ns/running"}) {
		t.Errorf("the selecting view holds %v, want [ns/running]", got)
	}
	if got := keys(all.Indexer().List()); !slices.Equal(got, []string{"ns/done", "ns/running"}) {
		t.Errorf("the other view holds %v, want both pods", got)
	}
}

// expireFirstWatch makes the client's first watch of resource end at once
// as expired, as after an API server restart: the reflector lists again.
// The channel is closed when the second list has been answered.
func expireFirstWatch(c *fake.Clientset, resource string) <-chan struct{} {
	var mu sync.Mutex
	watches, lists := 0, 0
	relisted := make(chan struct{})
	c.PrependWatchReactor(resource, func(a k8stesting.Action) (bool, watch.Interface, error) {
		mu.Lock()
		defer mu.Unlock()
		if watches++; watches > 1 {
			return false, nil, nil
		}
		w := watch.NewFakeWithChanSize(1, false)
		w.Error(&metav1.Status{Status: metav1.StatusFailure, Code: 410, Reason: metav1.StatusReasonExpired})
		return true, w, nil
	})
	c.PrependReactor("list", resource, func(k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		if lists++; lists == 2 {
			close(relisted)
		}
		return false, nil, nil
	})
	return relisted
}

func TestARelistKeepsTheRecordOfAnObjectOfTheSameVersion(t *testing.T) {
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprintf("shared=%v", shared), func(t *testing.T) {
			x, y := svc("a", "x", nil), svc("a", "y", nil)
			x.ResourceVersion, y.ResourceVersion = "5", "5"
			c := fake.NewClientset(x, y)
			relisted := expireFirstWatch(c, "services")
			f := New(c)
			h := f.Register(View{Kind: Services, Name: "dns", Record: tagged("dns")})
			if shared {
				f.Register(View{Kind: Services, Name: "controller"})
			}
			var ev events
			start(t, f, h)
			before := map[string]any{}
			for _, k := range []string{"a/x", "a/y"} {
				before[k], _, _ = h.Indexer().GetByKey(k)
			}
			// y changes: the relist, or the watch after it, brings it.
			y = y.DeepCopy()
			y.ResourceVersion, y.Spec.ClusterIP = "6", "10.0.0.6"
			if err := c.Tracker().Update(corev1.SchemeGroupVersion.WithResource("services"), y, "a"); err != nil {
				t.Fatal(err)
			}
			if _, err := h.AddEventHandler(ev.handler()); err != nil {
				t.Fatal(err)
			}
			<-relisted
			if err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 10*time.Second, true,
				func(context.Context) (bool, error) {
					now, _, _ := h.Indexer().GetByKey("a/y")
					return now != before["a/y"], nil
				}); err != nil {
				t.Fatal("the relist's changed y never reached the store")
			}
			if now, _, _ := h.Indexer().GetByKey("a/x"); now != before["a/x"] {
				t.Errorf("x, listed again at the same version, has a new record %p; want the stored %p", now, before["a/x"])
			}
		})
	}
}
