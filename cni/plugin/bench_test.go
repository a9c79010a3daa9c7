package plugin_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/vishvananda/netlink"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
)

// contender is one plugin chain under measurement, on its own node namespace.
type contender struct {
	name string
	node *netns.NS
	cni  *libcni.CNIConfig
	list *libcni.NetworkConfigList
}

func newContender(b *testing.B, name string, path []string, plugin map[string]any) *contender {
	conf := map[string]any{"cniVersion": "1.0.0", "name": name, "plugins": []any{plugin}}
	raw, _ := json.Marshal(conf)
	list, err := libcni.NetworkConfFromBytes(raw)
	if err != nil {
		b.Fatal(err)
	}
	return &contender{name: name, node: netns.New(b, "bench"), cni: newCNI(path, cacheDir(b)), list: list}
}

// cacheDir is libcni's result cache (a runtime's /var/lib/cni/results): a
// temporary directory, under $NETPLANE_BENCH_CNI_CACHE if set (a tmpfs there
// keeps the disk's latency out of both contenders' numbers).
func cacheDir(b *testing.B) string {
	parent := os.Getenv("NETPLANE_BENCH_CNI_CACHE")
	if parent == "" {
		return b.TempDir()
	}
	d, err := os.MkdirTemp(parent, "netplane-bench-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// run times one libcni call per pod, with at most `parallel` in flight.
func (c *contender) run(b *testing.B, pods []*netns.NS, parallel int, add bool) []time.Duration {
	lat := make([]time.Duration, len(pods))
	var wg sync.WaitGroup
	sem := make(chan struct{}, parallel)
	var mu sync.Mutex
	var firstErr error
	for i, pod := range pods {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			rt := &libcni.RuntimeConf{ContainerID: fmt.Sprintf("bench-%d", i), NetNS: pod.Path, IfName: "eth0"}
			err := c.node.Do(func() error {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				start := time.Now()
				var err error
				if add {
					_, err = c.cni.AddNetworkList(ctx, c.list, rt)
				} else {
					err = c.cni.DelNetworkList(ctx, c.list, rt)
				}
				lat[i] = time.Since(start)
				return err
			})
			if err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = fmt.Errorf("%s pod %d: %w", c.name, i, err)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	return lat
}

// phase adds and deletes n pods, n/parallel at a time, as a runtime does: a
// fresh netns per pod, removed after DEL. The kernel then destroys what is
// left in the background; phase returns once that is done.
func (c *contender) phase(b *testing.B, n, parallel int, s samples) {
	pods := make([]*netns.NS, n)
	for i := range pods {
		pods[i] = netns.New(b, "bpod")
	}
	for _, verb := range []string{"add", "del"} {
		cpu := childrenCPU(b)
		lat := c.run(b, pods, parallel, verb == "add")
		s.add(c.name+" "+verb, lat, childrenCPU(b)-cpu)
	}
	for _, pod := range pods {
		if err := pod.Delete(); err != nil {
			b.Fatal(err)
		}
	}
	c.waitForNoVeths(b)
	// The kernel tears removed namespaces down in the background, taking
	// the rtnl lock; let it finish, so that the next phase, of either
	// contender, does not pay for this one's teardown.
	time.Sleep(500 * time.Millisecond)
}

func (c *contender) waitForNoVeths(b *testing.B) {
	nl := handle(b, c.node)
	if wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		links, _ := nl.LinkList()
		return !slices.ContainsFunc(links, func(l netlink.Link) bool { return l.Type() == "veth" }), nil
	}) != nil {
		b.Fatalf("%s: veths still on the node 30 s after their netns were removed", c.name)
	}
}

func percentile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// BenchmarkAddDelAgainstBridgeAndHostLocal measures ADD and DEL latency of
// netplane-cni and of the reference bridge + host-local plugins, through
// libcni in the same run: 200 pods one after another (sequential, five
// rounds), then 30 at once (concurrent30, twenty rounds). Rounds alternate
// who goes first. Run with `make bench` (-benchtime 1x), or one case with
// -bench 'AddDelAgainst/concurrent30'. Ratios are netplane/reference, so
// 0.5 means netplane takes half the reference's time; cpu-ms is the plugin
// processes' CPU time (user + system, children included) per call.
func BenchmarkAddDelAgainstBridgeAndHostLocal(b *testing.B) {
	for _, phase := range []struct {
		name                   string
		pods, parallel, rounds int
	}{{"sequential", 200, 1, 5}, {"concurrent30", 30, 30, 20}} {
		b.Run(phase.name, func(b *testing.B) {
			framework.RequireRoot(b)
			bridge := framework.RequireBinary(b, "cni/bridge")
			framework.RequireBinary(b, "cni/host-local")
			ours := newContender(b, "netplane", []string{pluginDir(b)}, map[string]any{
				"type": "netplane-cni", "bridge": "cni0", "mtu": 1500, "podCIDRs": []string{"10.244.0.0/22"}, "stateDir": b.TempDir(),
			})
			ref := newContender(b, "reference", []string{filepath.Dir(bridge)}, map[string]any{
				"type": "bridge", "bridge": "cni0", "mtu": 1500, "isDefaultGateway": true, "hairpinMode": true,
				"ipam": map[string]any{"type": "host-local", "ranges": [][]map[string]string{{{"subnet": "10.244.0.0/22"}}}, "dataDir": b.TempDir()},
			})
			for range b.N {
				s := samples{}
				// A shared machine's noise then hits both contenders alike.
				for round := range phase.rounds {
					order := []*contender{ours, ref}
					if round%2 == 1 {
						order = []*contender{ref, ours}
					}
					for _, c := range order {
						c.phase(b, phase.pods, phase.parallel, s)
					}
				}
				s.report(b)
			}
		})
	}
}

// samples are latencies and CPU times per contender and verb ("netplane add").
type samples map[string]*verbSamples

type verbSamples struct {
	lat    []time.Duration   // all rounds pooled
	rounds [][]time.Duration // each round's own
	cpu    time.Duration     // of the plugin processes of all calls
}

func (s samples) add(key string, lat []time.Duration, cpu time.Duration) {
	if s[key] == nil {
		s[key] = &verbSamples{}
	}
	s[key].lat = append(s[key].lat, lat...)
	s[key].rounds = append(s[key].rounds, lat)
	s[key].cpu += cpu
}

// roundMedian is the median over the rounds of each round's p-th
// percentile: a burst of other work on the shared machine during one round
// moves it less than the pooled figure.
func (v *verbSamples) roundMedian(p float64) time.Duration {
	per := make([]time.Duration, len(v.rounds))
	for i, r := range v.rounds {
		per[i] = percentile(r, p)
	}
	return percentile(per, 0.5)
}

func (s samples) report(b *testing.B) {
	b.Logf("load average %s", framework.LoadAverage())
	for _, verb := range []string{"add", "del"} {
		o, r := s["netplane "+verb], s["reference "+verb]
		for _, q := range []struct {
			name string
			p    float64
		}{{"p50", 0.50}, {"p99", 0.99}} {
			for _, way := range []struct {
				name string
				of   func(*verbSamples) time.Duration
			}{
				{"", func(v *verbSamples) time.Duration { return v.roundMedian(q.p) }},
				{"-pooled", func(v *verbSamples) time.Duration { return percentile(v.lat, q.p) }},
			} {
				op, rp := way.of(o), way.of(r)
				key := verb + "-" + q.name + way.name
				b.ReportMetric(ms(op), key+"-netplane-ms")
				b.ReportMetric(ms(rp), key+"-reference-ms")
				b.ReportMetric(float64(op)/float64(rp), key+"-ratio")
				b.Logf("%-15s netplane %8.2f ms  reference %8.2f ms  ratio %.2f", key, ms(op), ms(rp), float64(op)/float64(rp))
			}
		}
		ocpu, rcpu := o.cpu/time.Duration(len(o.lat)), r.cpu/time.Duration(len(r.lat))
		b.ReportMetric(ms(ocpu), verb+"-cpu-netplane-ms")
		b.ReportMetric(ms(rcpu), verb+"-cpu-reference-ms")
		b.Logf("%-15s netplane %8.2f ms  reference %8.2f ms  (plugin CPU per call)", verb+"-cpu", ms(ocpu), ms(rcpu))
	}
	b.Logf("p50/p99: median of the %d rounds' own; pooled: all %d calls per plugin and verb", len(s["netplane add"].rounds), len(s["netplane add"].lat))
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// childrenCPU is the CPU time of every child process reaped so far.
func childrenCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkStatus times STATUS through libcni on a ready node: kubelet asks
// every few seconds, so it must stay in the low milliseconds (process start
// included).
func BenchmarkStatus(b *testing.B) {
	framework.RequireRoot(b)
	c := newContender(b, "netplane", []string{pluginDir(b)}, map[string]any{
		"type": "netplane-cni", "bridge": "cni0", "podCIDRs": []string{"10.244.0.0/24"}, "stateDir": b.TempDir(),
	})
	c.node.MustExec(b, "ip", "link", "add", "cni0", "type", "bridge")
	c.node.MustExec(b, "ip", "link", "set", "cni0", "up")
	c.list.CNIVersion = "1.1.0"
	c.list.Plugins[0].Network.CNIVersion = "1.1.0"
	lat := make([]time.Duration, 0, max(b.N, 20))
	for i := 0; i < max(b.N, 20); i++ {
		err := c.node.Do(func() error {
			start := time.Now()
			err := c.cni.GetStatusNetworkList(context.Background(), c.list)
			lat = append(lat, time.Since(start))
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(ms(percentile(lat, 0.5)), "p50-ms")
	b.ReportMetric(ms(percentile(lat, 0.99)), "p99-ms")
	b.Logf("STATUS p50 %v p99 %v", percentile(lat, 0.5), percentile(lat, 0.99))
}
