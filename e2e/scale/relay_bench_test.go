package scale

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
	"github.com/netplane/netplane/internal/podrelay"
	"github.com/netplane/netplane/internal/role"
)

// readersEach is how many readers of every pod read the API server, and
// how many read the relay: node roles, as far as their pod watch goes.
const readersEach = 10

// BenchmarkPodRelayFanOut measures what a pod change costs the readers
// of every pod (each node role's NetworkPolicy), reading the API server as
// they do without relays and reading one relay (netplane --role=relay,
// its own process in a namespace): bytes and watch events per reader per
// change, for a label change (which every node's rules read) and for a
// readiness flip (which none does: most of a rollout's pod updates), and
// the pod watches the API server serves.
func BenchmarkPodRelayFanOut(b *testing.B) {
	bin, sizes, api, w := filledCluster(b, nil)
	ns := nodeNS(b)
	r := startRelay(b, api, ns, NodeIP(0).String(), bin)
	relayIn, p, ca := r.received, r.p, r.ca
	for b.Loop() {
		direct := startReaders(b, func(d dialFunc) kubernetes.Interface {
			c, err := kubernetes.NewForConfig(withDial(role.ProtobufConfig(api.RestConfig), d))
			if err != nil {
				b.Fatal(err)
			}
			return c
		})
		relayed := startReaders(b, func(d dialFunc) kubernetes.Interface {
			rc := rest.CopyConfig(api.RestConfig)
			rc.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
				return d(ctx, network, addr, func() (net.Conn, error) { return ns.Dial(network, addr) })
			}
			c, err := podrelay.Client(api.Client, rc, "kube-system/netplane-relay", ca, "node-0")
			if err != nil {
				b.Fatal(err)
			}
			return c
		})
		watches := podWatches(b, api.Client)
		b.Logf("readers synced: first list %.1f MB each from the API server, %.1f MB from the relay; the API server serves %d pod watches (%d readers and the relay); load %s",
			direct.listed()/1e6, relayed.listed()/1e6, watches, readersEach, framework.LoadAverage())
		for _, kind := range []string{"label", "readiness"} {
			direct.reset()
			relayed.reset()
			relayIn0 := relayIn.Load()
			n := podChurn(b, w, sizes, kind)
			b.Logf("%d %s changes: per reader from the API server %.0f bytes and %.2f events a change; from the relay %.0f bytes and %.2f events (%.2fx the bytes); the relay received %.0f bytes a change; load %s",
				n, kind, direct.perChange(n), direct.eventsPerChange(n), relayed.perChange(n), relayed.eventsPerChange(n),
				relayed.perChange(n)/direct.perChange(n), float64(relayIn.Load()-relayIn0)/float64(n), framework.LoadAverage())
			b.ReportMetric(relayed.perChange(n)/direct.perChange(n), kind+"-bytes-ratio")
		}
		b.Logf("the relay: %d MiB resident, %d MiB at its peak, for %d pods",
			framework.StatusKiB(p.Cmd.Process.Pid, "VmRSS")/1024, framework.StatusKiB(p.Cmd.Process.Pid, "VmHWM")/1024, sizes.Pods)
	}
}

type dialFunc func(ctx context.Context, network, addr string, dial func() (net.Conn, error)) (net.Conn, error)

func withDial(c *rest.Config, d dialFunc) *rest.Config {
	c = rest.CopyConfig(c)
	c.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		return d(ctx, network, addr, func() (net.Conn, error) { return (&net.Dialer{}).DialContext(ctx, network, addr) })
	}
	return c
}

// readers are readersEach informers of every pod, each on a connection of
// its own whose received bytes are counted.
type readers struct {
	bytes, events []atomic.Int64
	listedBytes   []int64
}

func startReaders(b *testing.B, client func(dialFunc) kubernetes.Interface) *readers {
	r := &readers{bytes: make([]atomic.Int64, readersEach), events: make([]atomic.Int64, readersEach)}
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	var synced []cache.InformerSynced
	for i := range readersEach {
		c := client(func(ctx context.Context, network, addr string, dial func() (net.Conn, error)) (net.Conn, error) {
			conn, err := dial()
			if err != nil {
				return nil, err
			}
			return countedConn{Conn: conn, n: &r.bytes[i]}, nil
		})
		pods := c.CoreV1().Pods("")
		lw := cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
			ListWithContextFunc:  func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return pods.List(ctx, o) },
			WatchFuncWithContext: pods.Watch,
		}, listedOnlyClient{c})
		inf := cache.NewSharedIndexInformer(lw, &v1.Pod{}, 0, cache.Indexers{})
		// Each keeps only the pod's key: the benchmark counts, it does
		// not hold the cluster ten times over.
		_ = inf.SetTransform(func(o any) (any, error) {
			m, err := meta.Accessor(o)
			if err != nil {
				return o, nil
			}
			return &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: m.GetNamespace(), Name: m.GetName(), ResourceVersion: m.GetResourceVersion()}}, nil
		})
		_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{UpdateFunc: func(any, any) { r.events[i].Add(1) }})
		go inf.RunWithContext(ctx)
		synced = append(synced, inf.HasSynced)
	}
	if !cache.WaitForCacheSync(benchCtx(b).Done(), synced...) {
		b.Fatal("the readers never synced")
	}
	for i := range r.bytes {
		r.listedBytes = append(r.listedBytes, r.bytes[i].Load())
	}
	return r
}

type listedOnlyClient struct{ kubernetes.Interface }

func (listedOnlyClient) IsWatchListSemanticsUnSupported() bool { return true }

type countedConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}

func (r *readers) reset() {
	for i := range r.bytes {
		r.bytes[i].Store(0)
		r.events[i].Store(0)
	}
}

func (r *readers) listed() float64 {
	var sum int64
	for _, n := range r.listedBytes {
		sum += n
	}
	return float64(sum) / float64(len(r.listedBytes))
}

func (r *readers) perChange(n int) float64 {
	var sum int64
	for i := range r.bytes {
		sum += r.bytes[i].Load()
	}
	return float64(sum) / float64(len(r.bytes)) / float64(max(n, 1))
}

func (r *readers) eventsPerChange(n int) float64 {
	var sum int64
	for i := range r.events {
		sum += r.events[i].Load()
	}
	return float64(sum) / float64(len(r.events)) / float64(max(n, 1))
}

// podChurn makes churnRate changes of a kind a second for churnFor, and
// returns how many were made; their watch events have arrived by then.
func podChurn(b *testing.B, w kubernetes.Interface, s Sizes, kind string) int {
	ctx := benchCtx(b)
	rng := rand.New(rand.NewPCG(3, 4))
	var done atomic.Int64
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	tick := time.NewTicker(time.Second / churnRate)
	defer tick.Stop()
	t0 := time.Now()
	for i := 0; time.Since(t0) < churnFor; i++ {
		<-tick.C
		j := rng.IntN(s.Pods)
		namespace, name := s.ServiceNamespace(s.serviceOf(j)), s.PodName(j)
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			var err error
			if kind == "label" {
				err = relabel(ctx, w, namespace, name, i)
			} else {
				status := []string{"True", "False"}[i%2]
				patch := fmt.Appendf(nil, `{"status":{"conditions":[{"type":"Ready","status":%q}]}}`, status)
				_, err = w.CoreV1().Pods(namespace).Patch(ctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
			}
			if err == nil {
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	time.Sleep(time.Second) // the last changes' watch events still on their way
	return int(done.Load())
}

// relayRun is a relay process started for a benchmark.
type relayRun struct {
	p        *framework.Process
	ca       string        // the authority of its certificate
	received *atomic.Int64 // what it received from the API server
}

// relayPort is where the benchmarks' relay serves.
const relayPort = "10292"

// startRelay runs a relay in host, on addr, against api, published as the
// Service kube-system/netplane-relay, and waits until it is ready.
func startRelay(b *testing.B, api *framework.APIServer, host *netns.NS, addr, bin string) relayRun {
	r := relayRun{received: &atomic.Int64{}}
	fwd := host.ForwardCounted(b, "127.0.0.1:0", strings.TrimPrefix(api.URL, "https://"), r.received)
	kc := filepath.Join(b.TempDir(), "relay-kubeconfig")
	if err := api.WriteKubeconfig(kc, "https://"+fwd, api.Token); err != nil {
		b.Fatal(err)
	}
	ca, crt, key := framework.ServingCert(b, "netplane-relay.kube-system.svc")
	r.ca = ca
	r.p = host.Start(b, bin, "--role=relay", "--kubeconfig="+kc, "--relay-bind-address="+net.JoinHostPort(addr, relayPort),
		"--relay-tls-cert-file="+crt, "--relay-tls-key-file="+key, "--health-bind-address=127.0.0.1:10293", "--metrics-bind-address=127.0.0.1:10294")
	b.Cleanup(func() { r.p.Stop(5 * time.Second) })
	publishRelay(b, api.Client, addr)
	if err := framework.Poll(benchCtx(b), 50*time.Millisecond, 20*time.Minute, "the relay ready", func(context.Context) error {
		_, err := get(host, "http://127.0.0.1:10293/readyz")
		return err
	}); err != nil {
		b.Fatalf("%v\n%s", err, r.p.Tail(20))
	}
	return r
}

// publishRelay makes the relay's Service and EndpointSlice, as the chart
// and the EndpointSlice controller would.
func publishRelay(b *testing.B, c kubernetes.Interface, addr string) {
	ctx := benchCtx(b)
	if _, err := c.CoreV1().Services("kube-system").Create(ctx, &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: "netplane-relay"},
		Spec: v1.ServiceSpec{ClusterIP: v1.ClusterIPNone, Ports: []v1.ServicePort{{Name: podrelay.PortName, Port: 10292}}}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	if _, err := c.DiscoveryV1().EndpointSlices("kube-system").Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "netplane-relay-1", Labels: map[string]string{discoveryv1.LabelServiceName: "netplane-relay"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To(podrelay.PortName), Port: ptr.To(int32(10292))}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{addr}}},
	}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
}

// podWatches is how many watches of pods the API server serves.
func podWatches(b *testing.B, c kubernetes.Interface) int {
	body, err := c.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(benchCtx(b))
	if err != nil {
		b.Fatal(err)
	}
	var n float64
	for line := range strings.SplitSeq(string(body), "\n") {
		if strings.HasPrefix(line, "apiserver_longrunning_requests{") && strings.Contains(line, `resource="pods"`) && strings.Contains(line, `verb="WATCH"`) {
			var v float64
			_, _ = fmt.Sscanf(line[strings.LastIndex(line, " ")+1:], "%g", &v)
			n += v
		}
	}
	return int(n)
}
