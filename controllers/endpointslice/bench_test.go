package endpointslice

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimit "golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/e2e/framework"
)

// benchScale is the benchmark's size: by default 2,000 Services of 25 pods,
// one of 5,000 pods, and 10,000 readiness flips at 10/s (the figures
// README.md reports). NETPLANE_BENCH_SCALE=services,pods,big,flips[,rate]
// shrinks it (e.g. 400,25,1000,2000,100 with NETPLANE_BENCH_OVERLOAD=0 for a
// quick run) or changes the churn rate (flips per second).
//
// The churn's default rate, 10/s, is half the 20 writes/s both contenders
// get, so a controller that writes one slice per flip keeps up and the
// latency is its own reaction time. An overload phase follows on other pods:
// NETPLANE_BENCH_OVERLOAD=flips,rate (default 10000,100; 0 skips it). Above
// the write rate, any controller owes a backlog that drains at 20 writes/s,
// so there the latency measures the token bucket more than the controller.
type benchScale struct{ services, pods, big, flips, rate, overFlips, overRate int }

func scaleFromEnv(b *testing.B) benchScale {
	s := benchScale{2000, 25, 5000, 10000, 10, 10000, 100}
	if v := os.Getenv("NETPLANE_BENCH_SCALE"); v != "" {
		n := []int{0, 0, 0, 0, s.rate}
		parts := strings.Split(v, ",")
		if len(parts) < 4 || len(parts) > 5 {
			b.Fatalf("NETPLANE_BENCH_SCALE=%q: want services,pods,big,flips[,rate]", v)
		}
		for i, p := range parts {
			var err error
			if n[i], err = strconv.Atoi(p); err != nil || n[i] < 0 {
				b.Fatalf("NETPLANE_BENCH_SCALE=%q: %q is not a count", v, p)
			}
		}
		s = benchScale{n[0], n[1], n[2], n[3], max(n[4], 1), s.overFlips, s.overRate}
	}
	if v := os.Getenv("NETPLANE_BENCH_OVERLOAD"); v != "" {
		var flips, rate int
		if v == "0" {
			s.overFlips = 0
		} else if _, err := fmt.Sscanf(v, "%d,%d", &flips, &rate); err != nil || flips < 0 || rate < 1 {
			b.Fatalf("NETPLANE_BENCH_OVERLOAD=%q: want flips,rate or 0", v)
		} else {
			s.overFlips, s.overRate = flips, rate
		}
	}
	return s
}

// churnResult is one churn phase: slice writes and the latency from a
// pod's Ready change to a slice showing it.
type churnResult struct {
	writes          int
	p50, p99, worst time.Duration
}

// BenchmarkAgainstKubeControllerManager runs kube-controller-manager and
// netplane, each alone against a fresh API server with the same objects and
// the same client QPS/burst (20/30), and reports cold-start time and writes,
// then, for the churn and the overload, the writes and the latency from a
// pod's Ready change to its slice. It is long because both contenders run
// the same phases in one place, so neither can be measured differently.
func BenchmarkAgainstKubeControllerManager(b *testing.B) {
	kcm := framework.RequireBinary(b, "kube-controller-manager")
	scale := scaleFromEnv(b)
	type result struct {
		cold            time.Duration
		coldWrites      int
		churn, overload churnResult
		overloaded      bool // the overload phase ran (there were pods left for it)
	}
	// run measures one contender, which start launches. Everything a run
	// started is stopped before the next one, so that no contender runs
	// beside another.
	run := func(name string, start func(s *framework.APIServer) contender) result {
		s := framework.StartAPIServer(b, framework.Options{})
		pods := populateBench(b, s, scale)
		w := watchSlices(b, s)
		progress(b, "%s: load average %s", name, framework.LoadAverage())
		t0, writes0 := time.Now(), sliceWrites(b, s)
		con := start(s)
		describe, stop := con.describe, con.stop
		defer s.Stop()
		defer w.stop()
		defer stop()
		w.waitCounts(b, expectedCounts(scale), 30*time.Minute)
		var r result
		writes1 := sliceWrites(b, s)
		r.cold, r.coldWrites = time.Since(t0), writes1.total()-writes0.total()
		progress(b, "%s: cold start %v, slice writes %s; %s", name, r.cold.Round(time.Millisecond), writes1.minus(writes0), describe())
		order := flipOrder(pods)
		churn, over := order[:min(scale.flips, len(order))], order[min(scale.flips, len(order)):]
		over = over[:min(scale.overFlips, len(over))]
		phase := func(label string, names []string, rate int) churnResult {
			w.stallSummary(time.Now()) // forget what came before
			before, start, cpu := sliceWrites(b, s), time.Now(), framework.CPUTime(con.proc.Cmd.Process.Pid)
			lat, sent, shown := flipAndMeasure(b, s, w, pods, names, rate)
			cpu = framework.CPUTime(con.proc.Cmd.Process.Pid) - cpu
			stalls := w.stallSummary(start)
			after := sliceWrites(b, s)
			// To a tenth of a millisecond: at a p99 of 20 ms, rounding to
			// the millisecond moves a ratio by up to 0.025.
			c := churnResult{after.total() - before.total(), percentileTo(lat, 50, flipUnit), percentileTo(lat, 99, flipUnit), percentile(lat, 100)}
			progress(b, "%s: %s of %d flips at %d/s (sent in %v, all shown after %v): slice writes %s; latency p50 %v p90 %v p99 %v max %v, %d flips took 1s or more; CPU %v (%v a flip); %s; load average %s",
				name, label, len(names), rate, sent.Round(time.Millisecond), shown.Round(time.Millisecond), after.minus(before),
				c.p50, percentile(lat, 90), c.p99, c.worst, countAtLeast(lat, time.Second), cpu, cpu/time.Duration(max(len(names), 1)),
				describe(), framework.LoadAverage())
			progress(b, "%s: %s: %s; %s", name, label, stalls, w.tailSummary(c.p99))
			if flips := w.takeFlips(); con.trace != "" {
				progress(b, "%s: %s: trace: %s", name, label, traceSummary(b, con.trace, flips, c.p99))
			}
			return c
		}
		r.churn = phase("churn", churn, scale.rate)
		if len(over) > 0 {
			r.overload, r.overloaded = phase("overload", over, scale.overRate), true
		}
		return r
	}
	if os.Getenv("NETPLANE_BENCH_NETPLANE_ONLY") == "1" { // for profiling netplane
		run("netplane", func(s *framework.APIServer) contender { return startBenchNetplane(b, s, 20, 30) })
		return
	}
	upstream := run("kube-controller-manager", func(s *framework.APIServer) contender {
		p, err := framework.StartProcess("kube-controller-manager", exec.Command(kcm,
			"--kubeconfig="+s.Kubeconfig, "--controllers=endpointslice,endpointslicemirroring",
			"--leader-elect=false", "--secure-port=0", "--use-service-account-credentials=false",
			"--kube-api-qps=20", "--kube-api-burst=30",
		), filepath.Join(s.Dir, "kube-controller-manager.log"))
		if err != nil {
			b.Fatal(err)
		}
		stop := func() { p.Stop(10 * time.Second) }
		b.Cleanup(stop)
		return contender{describe: func() string { return "" }, stop: stop, proc: p}
	})
	ours := run("netplane", func(s *framework.APIServer) contender { return startBenchNetplane(b, s, 20, 30) })
	ratio := func(a, b float64) float64 { return a / b }
	churnRatios := func(prefix string, ours, theirs churnResult) {
		b.ReportMetric(ratio(float64(ours.writes), float64(theirs.writes)), prefix+"-writes-ratio")
		b.ReportMetric(ratio(float64(ours.p99), float64(theirs.p99)), prefix+"-p99-ratio")
		b.ReportMetric(ratio(float64(ours.p50), float64(theirs.p50)), prefix+"-p50-ratio")
	}
	b.ReportMetric(ratio(ours.cold.Seconds(), upstream.cold.Seconds()), "cold-time-ratio")
	b.ReportMetric(ratio(float64(ours.coldWrites), float64(upstream.coldWrites)), "cold-writes-ratio")
	churnRatios("churn", ours.churn, upstream.churn)
	if ours.overloaded && upstream.overloaded {
		churnRatios("overload", ours.overload, upstream.overload)
	}
	if os.Getenv("NETPLANE_BENCH_SAME_RATE_ONLY") == "1" {
		return
	}
	// netplane's own defaults: a higher write rate, kept safe by the API
	// server's priority and fairness.
	d := v1alpha1.Default().Controller
	own := run(fmt.Sprintf("netplane with its defaults (QPS %v/%d)", d.KubeAPIQPS, d.KubeAPIBurst), func(s *framework.APIServer) contender {
		return startBenchNetplane(b, s, d.KubeAPIQPS, int(d.KubeAPIBurst))
	})
	b.ReportMetric(ratio(own.cold.Seconds(), upstream.cold.Seconds()), "defaults-cold-time-ratio")
	b.ReportMetric(ratio(float64(own.coldWrites), float64(upstream.coldWrites)), "defaults-cold-writes-ratio")
	churnRatios("defaults-churn", own.churn, upstream.churn)
	if own.overloaded && upstream.overloaded {
		churnRatios("defaults-overload", own.overload, upstream.overload)
	}
}

// startBenchNetplane runs `netplane --role=controller` as a process with the
// given write rate limits; its informers keep the default 20/30, as
// kube-controller-manager's do. With NETPLANE_BENCH_TRACE=1 it logs at
// level 5, for the trace.
func startBenchNetplane(b *testing.B, s *framework.APIServer, qps float32, burst int) contender {
	name := fmt.Sprintf("netplane-%v-%d", qps, burst)
	args := []string{fmt.Sprintf("--controller-kube-api-qps=%v", qps), fmt.Sprintf("--controller-kube-api-burst=%d", burst)}
	tracing := os.Getenv("NETPLANE_BENCH_TRACE") == "1"
	if tracing {
		args = append(args, "--v=5")
	}
	p := startNetplane(b, s, name, args...)
	trace := ""
	if tracing {
		trace = p.p.Log
	}
	return contender{
		describe: func() string {
			return "syncs " + formatCounts(p.counters(b, "netplane_endpointslice_syncs_total", "result"))
		},
		stop: func() { p.p.Stop(15 * time.Second) }, trace: trace, proc: p.p,
	}
}

// progress logs a result and also prints it at once: a benchmark's log is
// shown only when it ends, and a full-scale run takes long enough that a
// partial result is worth seeing.
func progress(b *testing.B, format string, args ...any) {
	b.Helper()
	b.Logf(format, args...)
	fmt.Fprintf(os.Stderr, format+"\n", args...)
}

func benchClient(s *framework.APIServer) kubernetes.Interface {
	rc := rest.CopyConfig(s.RestConfig)
	rc.QPS, rc.Burst = 2000, 4000
	rc.WarningHandler = rest.NoWarnings{}
	return kubernetes.NewForConfigOrDie(rc)
}

func benchServiceNames(scale benchScale) map[string]int {
	out := map[string]int{"big": scale.big}
	for i := range scale.services {
		out[fmt.Sprintf("s%d", i)] = scale.pods
	}
	return out
}

func expectedCounts(scale benchScale) map[string]int { return benchServiceNames(scale) }

// populateBench creates the Services, ready Pods on three zoned Nodes, and
// returns the pods by name, as last written (for cheap status flips).
func populateBench(b *testing.B, s *framework.APIServer, scale benchScale) map[string]*corev1.Pod {
	c := benchClient(s)
	ctx := context.Background()
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bench"}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	for i := range 3 {
		if _, err := c.CoreV1().Nodes().Create(ctx, newNode(fmt.Sprintf("node-%d", i+1), fmt.Sprintf("zone-%d", i)), metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	type job struct {
		svc string
		i   int
	}
	jobs := make(chan job)
	var mu sync.Mutex
	pods := map[string]*corev1.Pod{}
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for j := range jobs {
				p := benchPod(j.svc, j.i)
				got := mustCreatePod(b, c, p)
				mu.Lock()
				pods[got.Name] = got
				mu.Unlock()
			}
		})
	}
	seq := 0
	for name, n := range benchServiceNames(scale) {
		svc := newService(name)
		svc.Namespace, svc.UID, svc.Spec.ClusterIP, svc.Spec.ClusterIPs = "bench", "", "", nil
		err := retryTransient(func() error {
			_, err := c.CoreV1().Services("bench").Create(ctx, svc, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) { // an earlier try went through
				return nil
			}
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
		for i := range n {
			jobs <- job{name, seq + i}
		}
		seq += n
	}
	close(jobs)
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
	return pods
}

// benchPod is pod number i (unique over the run, so IPs are unique) of svc.
func benchPod(svc string, i int) *corev1.Pod {
	ip := fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)
	p := newPod(svc, 0, onNode(fmt.Sprintf("node-%d", i%3+1)))
	p.Name, p.Namespace, p.UID, p.ResourceVersion = fmt.Sprintf("%s-%d", svc, i), "bench", "", ""
	p.Spec.Containers[0].Image = "pause"
	p.Status.PodIP, p.Status.PodIPs = ip, []corev1.PodIP{{IP: ip}}
	return p
}

// mustCreatePod creates p and sets its status, retrying what a loaded API
// server fails transiently (etcd timeouts); it fails the benchmark only
// after several tries, and never stops the caller's loop (it may run on a
// worker goroutine).
func mustCreatePod(b *testing.B, c kubernetes.Interface, p *corev1.Pod) *corev1.Pod {
	ctx := context.Background()
	status := p.Status
	var got *corev1.Pod
	err := retryTransient(func() (err error) {
		got, err = c.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) { // an earlier try went through
			got, err = c.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		}
		return err
	})
	if err == nil {
		err = retryTransient(func() error {
			got.Status = status
			updated, err := c.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, got, metav1.UpdateOptions{})
			switch {
			case err == nil:
				got = updated
			case apierrors.IsConflict(err): // an earlier try went through
				if cur, getErr := c.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{}); getErr == nil {
					got = cur
				}
			}
			return err
		})
	}
	if err != nil {
		b.Errorf("pod %s: %v", p.Name, err)
		return p
	}
	return got
}

// retryTransient runs f up to five times, a second apart, while it fails.
func retryTransient(f func() error) error {
	var err error
	for range 5 {
		if err = f(); err == nil {
			return nil
		}
		time.Sleep(time.Second)
	}
	return err
}

// sliceWatch follows every EndpointSlice: endpoint counts per Service, and
// the moment a flipped pod's endpoint shows the new readiness.
type sliceWatch struct {
	mu      sync.Mutex
	counts  map[string]int // service → endpoints over its slices
	sizes   map[string]int // slice → its endpoints
	pending map[string]time.Time
	latency []time.Duration
	// byPod is each flip's latency by pod name, for the tail's make-up.
	byPod map[string]time.Duration
	// podWrites are the flips' own API round trips, slowStarts when the
	// flips that took 1 s or more were sent: a stall of the API server
	// shows as slow pod writes and slow flips sent within a few seconds.
	podWrites  []time.Duration
	slowStarts []time.Time
	// flips are each flip's moments by pod name, for the trace.
	flips   map[string]*flipTimes
	changed chan struct{}
	stop    func()
}

func watchSlices(b *testing.B, s *framework.APIServer) *sliceWatch {
	w := &sliceWatch{counts: map[string]int{}, sizes: map[string]int{}, pending: map[string]time.Time{},
		byPod: map[string]time.Duration{}, flips: map[string]*flipTimes{}, changed: make(chan struct{}, 1)}
	f := informers.NewSharedInformerFactory(benchClient(s), 0)
	f.Discovery().V1().EndpointSlices().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { w.observe(o.(*discovery.EndpointSlice), false) },
		UpdateFunc: func(_, o any) { w.observe(o.(*discovery.EndpointSlice), false) },
		DeleteFunc: func(o any) {
			if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = t.Obj
			}
			w.observe(o.(*discovery.EndpointSlice), true)
		},
	})
	ctx, cancel := context.WithCancel(context.Background())
	w.stop = sync.OnceFunc(func() { cancel(); f.Shutdown() })
	b.Cleanup(w.stop)
	f.Start(ctx.Done())
	return w
}

func (w *sliceWatch) observe(s *discovery.EndpointSlice, deleted bool) {
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	n := len(s.Endpoints)
	if deleted {
		n = 0
	}
	svc := s.Labels[discovery.LabelServiceName]
	w.counts[svc] += n - w.sizes[s.Name]
	w.sizes[s.Name] = n
	for _, e := range s.Endpoints {
		if e.TargetRef == nil || e.Conditions.Ready == nil || *e.Conditions.Ready {
			continue
		}
		if t0, ok := w.pending[e.TargetRef.Name]; ok && !deleted {
			w.latency = append(w.latency, now.Sub(t0))
			w.byPod[e.TargetRef.Name] = now.Sub(t0)
			if f := w.flips[e.TargetRef.Name]; f != nil {
				f.shown = now
			}
			if now.Sub(t0) >= time.Second {
				w.slowStarts = append(w.slowStarts, t0)
			}
			delete(w.pending, e.TargetRef.Name)
		}
	}
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

func (w *sliceWatch) waitCounts(b *testing.B, want map[string]int, timeout time.Duration) {
	deadline := time.After(timeout)
	for {
		w.mu.Lock()
		missing := 0
		for svc, n := range want {
			if w.counts[svc] != n {
				missing++
			}
		}
		w.mu.Unlock()
		if missing == 0 {
			return
		}
		select {
		case <-w.changed:
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			b.Fatalf("%d Services still without their endpoints after %v", missing, timeout)
		}
	}
}

// flipOrder is every pod name in a fixed random order: the churn phases
// flip consecutive runs of it, so no pod is flipped twice.
func flipOrder(pods map[string]*corev1.Pod) []string {
	names := slices.Sorted(maps.Keys(pods))
	rand.New(rand.NewPCG(7, 7)).Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
	return names
}

// flipAndMeasure sets Ready=False on the pods names at rate flips per
// second, and returns each flip's latency until a slice showed it,
// how long sending the flips took and how long until the last one showed.
//
// The pace matters: how long the flips take decides how many of one
// Service's flips a sync can batch, so an unpaced flipper, as fast as a
// loaded API server lets it be, would give the contenders different work.
func flipAndMeasure(b *testing.B, s *framework.APIServer, w *sliceWatch, pods map[string]*corev1.Pod, names []string, rate int) (lat []time.Duration, sent, total time.Duration) {
	c := benchClient(s)
	jobs := make(chan string)
	var wg sync.WaitGroup
	t0 := time.Now()
	for range 16 {
		wg.Go(func() {
			for name := range jobs {
				p := pods[name].DeepCopy()
				p.Status.Conditions[0].Status = corev1.ConditionFalse
				p.Status.Conditions[0].LastTransitionTime = metav1.Now()
				w.mu.Lock()
				sentAt := time.Now()
				w.pending[name] = sentAt
				f := &flipTimes{sent: sentAt}
				w.flips[name] = f
				w.mu.Unlock()
				err := retryTransient(func() error {
					_, err := c.CoreV1().Pods("bench").UpdateStatus(context.Background(), p, metav1.UpdateOptions{})
					if apierrors.IsConflict(err) {
						// A loaded API server can fail a write it made (a
						// timeout); then the retry conflicts with it.
						cur, getErr := c.CoreV1().Pods("bench").Get(context.Background(), name, metav1.GetOptions{})
						if getErr == nil && cur.Status.Conditions[0].Status == corev1.ConditionFalse {
							return nil // an earlier try went through
						}
					}
					return err
				})
				w.mu.Lock()
				f.written = time.Now()
				w.podWrites = append(w.podWrites, f.written.Sub(sentAt))
				w.mu.Unlock()
				if err != nil {
					b.Errorf("flipping %s: %v", name, err)
					w.mu.Lock()
					delete(w.pending, name)
					w.mu.Unlock()
				}
			}
		})
	}
	pace := ratelimit.NewLimiter(ratelimit.Limit(rate), 1)
	for _, name := range names {
		if err := pace.Wait(context.Background()); err != nil {
			b.Fatal(err)
		}
		jobs <- name
	}
	close(jobs)
	wg.Wait()
	sent = time.Since(t0)
	deadline := time.After(30 * time.Minute)
	for {
		w.mu.Lock()
		left := len(w.pending)
		w.mu.Unlock()
		if left == 0 {
			break
		}
		select {
		case <-w.changed:
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			b.Fatalf("%d flips never showed in a slice", left)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	lat, w.latency = w.latency, nil
	return lat, sent, time.Since(t0)
}
