package plugin_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/vishvananda/netlink"

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
	return &contender{name: name, node: netns.New(b, "bench"), cni: newCNI(path, b.TempDir()), list: list}
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
func (c *contender) phase(b *testing.B, n, parallel int) (add, del []time.Duration) {
	pods := make([]*netns.NS, n)
	for i := range pods {
		pods[i] = netns.New(b, "bpod")
	}
	add = c.run(b, pods, parallel, true)
	del = c.run(b, pods, parallel, false)
	for _, pod := range pods {
		if err := pod.Delete(); err != nil {
			b.Fatal(err)
		}
	}
	c.waitForNoVeths(b)
	return add, del
}

func (c *contender) waitForNoVeths(b *testing.B) {
	nl := handle(b, c.node)
	deadline := time.Now().Add(30 * time.Second)
	for {
		links, _ := nl.LinkList()
		if !slices.ContainsFunc(links, func(l netlink.Link) bool { return l.Type() == "veth" }) {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%s: veths still on the node 30 s after their netns were removed", c.name)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func percentile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// BenchmarkAddDelAgainstBridgeAndHostLocal measures ADD and DEL latency
// (p50, p99) of netplane-cni and of the reference bridge + host-local
// plugins, through libcni in the same run: 200 pods one after another, then
// 50 at once, three rounds each. Run with `make bench` (-benchtime 1x); the ratios are
// reference/netplane, so 2 means netplane is twice as fast.
func BenchmarkAddDelAgainstBridgeAndHostLocal(b *testing.B) {
	framework.RequireRoot(b)
	framework.Require(b, pluginDir != "", "netplane-cni was not built")
	bridge := framework.RequireBinary(b, "cni/bridge")
	framework.RequireBinary(b, "cni/host-local")
	ours := newContender(b, "netplane", []string{pluginDir}, map[string]any{
		"type": "netplane-cni", "bridge": "cni0", "mtu": 1500, "podCIDRs": []string{"10.244.0.0/22"}, "stateDir": b.TempDir(),
	})
	ref := newContender(b, "reference", []string{filepath.Dir(bridge)}, map[string]any{
		"type": "bridge", "bridge": "cni0", "mtu": 1500, "isDefaultGateway": true, "hairpinMode": true,
		"ipam": map[string]any{"type": "host-local", "ranges": [][]map[string]string{{{"subnet": "10.244.0.0/22"}}}, "dataDir": b.TempDir()},
	})
	// Three rounds, alternating who goes first, pooled: a shared machine's
	// noise then hits both contenders alike.
	const rounds = 3
	for range b.N {
		for _, phase := range []struct {
			name           string
			pods, parallel int
		}{{"sequential200", 200, 1}, {"concurrent50", 50, 50}} {
			lat := map[string][]time.Duration{}
			for round := range rounds {
				order := []*contender{ours, ref}
				if round%2 == 1 {
					order = []*contender{ref, ours}
				}
				for _, c := range order {
					add, del := c.phase(b, phase.pods, phase.parallel)
					lat[c.name+"add"] = append(lat[c.name+"add"], add...)
					lat[c.name+"del"] = append(lat[c.name+"del"], del...)
				}
			}
			for _, verb := range []string{"add", "del"} {
				for _, q := range []struct {
					name string
					p    float64
				}{{"p50", 0.50}, {"p99", 0.99}} {
					op, rp := percentile(lat["netplane"+verb], q.p), percentile(lat["reference"+verb], q.p)
					key := fmt.Sprintf("%s-%s-%s", phase.name, verb, q.name)
					b.ReportMetric(float64(op.Microseconds())/1000, key+"-netplane-ms")
					b.ReportMetric(float64(rp.Microseconds())/1000, key+"-reference-ms")
					b.ReportMetric(float64(rp)/float64(op), key+"-speedup")
					b.Logf("%-28s netplane %7.2f ms  reference %7.2f ms  speedup %.2fx", key, float64(op.Microseconds())/1000, float64(rp.Microseconds())/1000, float64(rp)/float64(op))
				}
			}
		}
	}
}

// BenchmarkStatus times STATUS through libcni on a ready node: kubelet asks
// every few seconds, so it must stay in the low milliseconds (process start
// included).
func BenchmarkStatus(b *testing.B) {
	framework.RequireRoot(b)
	framework.Require(b, pluginDir != "", "netplane-cni was not built")
	c := newContender(b, "netplane", []string{pluginDir}, map[string]any{
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
	b.ReportMetric(float64(percentile(lat, 0.5).Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(percentile(lat, 0.99).Microseconds())/1000, "p99-ms")
	b.Logf("STATUS p50 %v p99 %v", percentile(lat, 0.5), percentile(lat, 0.99))
}
