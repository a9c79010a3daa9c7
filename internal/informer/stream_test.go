package informer

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"

	"github.com/netplane/netplane/e2e/framework"
)

// listSink is a ListSink of pod names that logs what it is handed.
type listSink struct {
	mu      sync.Mutex
	pods    map[string]bool
	seen    map[string]bool // named by the open list
	log     []string
	ended   chan struct{} // closed by the first EndList
	replace bool          // Replace was called
}

func newListSink() *listSink {
	return &listSink{pods: map[string]bool{}, seen: map[string]bool{}, ended: make(chan struct{})}
}

func podName(o runtime.Object) any {
	p := o.(*corev1.Pod)
	return &name{meta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}}
}

func (s *listSink) do(verb string, obj any, f func(k string)) error {
	n, ok := obj.(*name)
	if !ok {
		return fmt.Errorf("handed a %T, want a record", obj)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.log = append(s.log, verb+" "+n.meta.Name)
	f(n.meta.Name)
	return nil
}

func (s *listSink) Add(obj any) error {
	return s.do("add", obj, func(k string) { s.pods[k], s.seen[k] = true, true })
}
func (s *listSink) Update(obj any) error { return s.Add(obj) }
func (s *listSink) Delete(obj any) error {
	return s.do("delete", obj, func(k string) { delete(s.pods, k) })
}

func (s *listSink) BeginList() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.log = append(s.log, "begin")
	s.seen = map[string]bool{}
}

func (s *listSink) EndList(rv string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.log = append(s.log, "end")
	for k := range s.pods {
		if !s.seen[k] {
			delete(s.pods, k)
		}
	}
	select {
	case <-s.ended:
	default:
		close(s.ended)
	}
	return nil
}

func (s *listSink) Replace(list []any, _ string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.replace = true
	return nil
}

func (s *listSink) Resync() error { return nil }

func (s *listSink) has(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pods[name]
}

func (s *listSink) lines() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.log)
}

func TestAListSinkIsHandedAWatchListsInitialEventsAsTheyArrive(t *testing.T) {
	pod := func(n string) *corev1.Pod { return testPod(n, corev1.PodRunning) }
	end := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "7",
		Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}}
	for _, tc := range []struct {
		name   string
		events []watch.Event
		// sink: what the sink was handed once every event went through;
		// passed: the events the reflector was handed.
		sink, passed []string
	}{
		{"the initial events go to the sink, the bookmark and what follows to the reflector",
			[]watch.Event{{Type: watch.Added, Object: pod("a")}, {Type: watch.Added, Object: pod("b")},
				{Type: watch.Bookmark, Object: end}, {Type: watch.Added, Object: pod("c")}},
			[]string{"begin", "add a", "add b"}, []string{"BOOKMARK", "ADDED c"}},
		{"a deletion among the initial events is the sink's",
			[]watch.Event{{Type: watch.Added, Object: pod("a")}, {Type: watch.Deleted, Object: pod("a")},
				{Type: watch.Bookmark, Object: end}},
			[]string{"begin", "add a", "delete a"}, []string{"BOOKMARK"}},
		{"a bookmark that does not end the initial events leaves them the sink's",
			[]watch.Event{{Type: watch.Bookmark, Object: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "5"}}},
				{Type: watch.Added, Object: pod("a")}, {Type: watch.Bookmark, Object: end}},
			[]string{"begin", "add a"}, []string{"BOOKMARK", "BOOKMARK"}},
		{"an error goes to the reflector, which watches again",
			[]watch.Event{{Type: watch.Added, Object: pod("a")}, {Type: watch.Error, Object: &metav1.Status{}}},
			[]string{"begin", "add a"}, []string{"ERROR"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sink := newListSink()
			s := newSinkStore(New(fake.NewClientset()).Register(View{Kind: Pods, Name: "dns", Record: podName, Sink: sink}))
			src := watch.NewFake()
			w := s.initialEvents(src)
			go func() {
				for _, e := range tc.events {
					src.Action(e.Type, e.Object)
				}
				src.Stop()
			}()
			var passed []string
			for e := range w.ResultChan() {
				line := string(e.Type)
				if p, ok := e.Object.(*corev1.Pod); ok && p.Name != "" {
					line += " " + p.Name
				}
				passed = append(passed, line)
			}
			if got := sink.lines(); !slices.Equal(got, tc.sink) {
				t.Errorf("the sink was handed %q, want %q", got, tc.sink)
			}
			if !slices.Equal(passed, tc.passed) {
				t.Errorf("the reflector was handed %q, want %q", passed, tc.passed)
			}
		})
	}
}

func TestAListGivenUpHandsTheSinkNothingOnceTheNextBegan(t *testing.T) {
	sink := newListSink()
	s := newSinkStore(New(fake.NewClientset()).Register(View{Kind: Pods, Name: "dns", Record: podName, Sink: sink}))
	first := s.begin()
	s.listed(first, podName(testPod("a", corev1.PodRunning)), sink.Add)
	second := s.begin()
	s.listed(first, podName(testPod("late", corev1.PodRunning)), sink.Add) // the first list's goroutine, still running
	s.listed(second, podName(testPod("b", corev1.PodRunning)), sink.Add)
	if err := s.Replace(nil, "9"); err != nil {
		t.Fatal(err)
	}
	want := []string{"begin", "add a", "begin", "add b", "end"}
	if got := sink.lines(); !slices.Equal(got, want) {
		t.Errorf("the sink was handed %q, want %q", got, want)
	}
	if sink.has("a") || sink.has("late") || !sink.has("b") {
		t.Errorf("the sink holds %v, want b alone", sink.pods)
	}
}

func TestStreamedListAppliesEachPageBeforeAskingForTheNext(t *testing.T) {
	f := &fakePages{pods: []*corev1.Pod{testPod("a", corev1.PodRunning), testPod("b", corev1.PodRunning),
		testPod("c", corev1.PodRunning), testPod("d", corev1.PodRunning), testPod("e", corev1.PodRunning)}}
	sink := newListSink()
	s := newSinkStore(New(fake.NewClientset()).Register(View{Kind: Pods, Name: "dns", Record: podName, Sink: sink}))
	var heldAtAsk []int
	list := func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
		sink.mu.Lock()
		heldAtAsk = append(heldAtAsk, len(sink.pods))
		sink.mu.Unlock()
		return f.list(ctx, o)
	}
	l, err := streamedList(context.Background(), metav1.ListOptions{ResourceVersion: "0"}, list, s)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Items) != 0 || l.ResourceVersion != "42" {
		t.Errorf("the reflector was handed %d items at version %q, want none at the list's 42", len(l.Items), l.ResourceVersion)
	}
	if want := []int{0, 2, 4}; !slices.Equal(heldAtAsk, want) {
		t.Errorf("the sink held %v pods as each page was asked for, want %v: each page applied before the next", heldAtAsk, want)
	}
}

// midList runs once, on the first response to a list or to a watch-list
// of pods: a change made then is made while the pods are listed.
type midList struct {
	next  http.RoundTripper
	once  sync.Once
	run   func()
	mu    sync.Mutex
	pages int  // list requests of pods
	wlist bool // a watch-list of pods was asked for
}

func (m *midList) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := m.next.RoundTrip(r)
	if err != nil || r.URL.Path != "/api/v1/pods" {
		return resp, err
	}
	q := r.URL.Query()
	m.mu.Lock()
	if q.Get("watch") == "true" && q.Get("sendInitialEvents") == "true" {
		m.wlist = true
	} else if q.Get("watch") != "true" {
		m.pages++
	}
	m.mu.Unlock()
	if q.Get("watch") != "true" || q.Get("sendInitialEvents") == "true" {
		m.once.Do(m.run)
	}
	return resp, nil
}

// TestPodsCreatedAndDeletedWhileListedAreNeitherLostNorResurrected lists
// 1,100 pods into a ListSink through a real API server, by watch-list and
// by pages of 500, while one pod is deleted and another created: the sink
// ends with the one and without the other, which only a watch continuing
// from the list's own version brings.
func TestPodsCreatedAndDeletedWhileListedAreNeitherLostNorResurrected(t *testing.T) {
	api := framework.StartAPIServer(t, framework.Options{})
	ctx := context.Background()
	const n = 1100
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < n; i += 8 {
				_, err := api.Client.CoreV1().Pods("default").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p-%04d", i)},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "pause"}}}}, metav1.CreateOptions{})
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name       string
		watchList  bool
		gone, late string
	}{{"watch-list", true, "p-1099", "late-0"}, {"paged list", false, "p-1098", "late-1"}} {
		t.Run(tc.name, func(t *testing.T) {
			gone, late := tc.gone, tc.late
			rt := &midList{run: func() {
				// The deleted pod is on the list's last page, of the snapshot
				// the first page was read from.
				if err := api.Client.CoreV1().Pods("default").Delete(ctx, gone, metav1.DeleteOptions{}); err != nil {
					t.Error(err)
				}
				if _, err := api.Client.CoreV1().Pods("default").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: late},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "pause"}}}}, metav1.CreateOptions{}); err != nil {
					t.Error(err)
				}
			}}
			cfg := rest.CopyConfig(api.RestConfig)
			cfg.Wrap(func(next http.RoundTripper) http.RoundTripper { rt.next = next; return rt })
			var client kubernetes.Interface = kubernetes.NewForConfigOrDie(cfg)
			if !tc.watchList {
				client = listedOnly{client}
			}
			sink := newListSink()
			f := New(client)
			f.Register(View{Kind: Pods, Name: "test", Record: podName, Sink: sink})
			runCtx, cancel := context.WithCancel(ctx)
			defer cancel()
			f.Start(runCtx)
			select {
			case <-sink.ended:
			case <-time.After(time.Minute):
				t.Fatalf("the list never ended: %d lines handed", len(sink.lines()))
			}
			err := wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
				return sink.has(late), nil
			})
			if err != nil {
				t.Fatalf("the pod created while listed never reached the sink")
			}
			if sink.has(gone) {
				t.Errorf("the pod deleted while listed, before the one created then, is still in the sink")
			}
			lines := sink.lines()
			if lines[0] != "begin" || slices.Index(lines, "end") != n+1 {
				t.Errorf("the sink was handed %q... with its end at %d; want one list of %d pods", lines[:min(3, len(lines))], slices.Index(lines, "end"), n)
			}
			if sink.replace {
				t.Error("the sink was handed a whole list (Replace)")
			}
			rt.mu.Lock()
			defer rt.mu.Unlock()
			if tc.watchList && (!rt.wlist || rt.pages != 0) {
				t.Errorf("watch-list asked: %v, lists %d; want a watch-list alone", rt.wlist, rt.pages)
			}
			if !tc.watchList && (rt.wlist || rt.pages != 3) {
				t.Errorf("watch-list asked: %v, lists %d; want 3 pages of at most %d for %d pods", rt.wlist, rt.pages, listPageSize, n)
			}
		})
	}
}
