package scale

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
)

func TestMain(m *testing.M) { framework.Main(m) }

// The node the benchmark runs is Node 0; beside its own pods it runs a
// server (in ns-0, selected by the policy of svc-0) and a client (a
// front-end in ns-1, an env=prod namespace), each in a network namespace
// of its own on the node's bridge.
const (
	bridge    = "npfield0"
	serverIP  = "10.0.0.200"
	clientIP  = "10.0.0.201"
	gatewayIP = "10.0.0.1"
	// Both the node role and kube-proxy serve on their namespace's own
	// loopback.
	healthAddr  = "127.0.0.1:10290"
	pprofAddr   = "127.0.0.1:6060"
	metricsAddr = "127.0.0.1:10249"
)

// benchPods are the server and the client, written with the cluster.
func benchPods(s Sizes) []*v1.Pod {
	server, client := s.Pod(0), s.Pod(0)
	server.Name, server.Namespace = "bench-server", Namespace(0)
	server.Labels = map[string]string{"app": s.ServiceName(0), "tier": "db"}
	server.Status.PodIP, server.Status.PodIPs = serverIP, []v1.PodIP{{IP: serverIP}}
	client.Name, client.Namespace = "bench-client", Namespace(1)
	client.Labels = map[string]string{"app": "bench-client", "tier": "fe"}
	client.Status.PodIP, client.Status.PodIPs = clientIP, []v1.PodIP{{IP: clientIP}}
	return []*v1.Pod{server, client}
}

// filledCluster starts an API server and fills it to the benchmark's
// sizes (-full: the published limits), with the pods extra makes of them
// (nil: none), and returns the netplane binary, the sizes, the API server
// and its writer.
func filledCluster(b *testing.B, extra func(Sizes) []*v1.Pod) (bin string, sizes Sizes, api *framework.APIServer, w kubernetes.Interface) {
	framework.RequireRoot(b)
	bin = filepath.Join(framework.NetplaneBinaries(b), "netplane")
	sizes = Tenth
	if *full {
		sizes = Field
	}
	api = framework.StartAPIServer(b, framework.Options{ServiceCIDRs: "10.96.0.0/16"})
	w, err := Writer(api.RestConfig)
	if err != nil {
		b.Fatal(err)
	}
	var pods []*v1.Pod
	if extra != nil {
		pods = extra(sizes)
	}
	start := time.Now()
	if err := Fill(benchCtx(b), w, sizes, pods, b.Logf); err != nil {
		b.Fatal(err)
	}
	b.Logf("cluster of %d Nodes, %d pods, %d Services, %d NetworkPolicies written in %v; load %s",
		sizes.Nodes, sizes.Pods, sizes.Services, sizes.Policies, time.Since(start).Round(time.Second), framework.LoadAverage())
	return bin, sizes, api, w
}

// peerIP is the address of the namespace on the other end of Node 0's
// eth0: its default gateway, and where a relay runs beside it.
const peerIP = "192.168.255.254"

// nodeNS is Node 0's namespace: eth0 with its address in the Nodes' subnet
// and a default route to a peer namespace.
func nodeNS(b *testing.B) *netns.NS {
	ns, _ := nodeAndPeer(b)
	return ns
}

func nodeAndPeer(b *testing.B) (node, peer *netns.NS) {
	node, peer = netns.New(b, "field"), netns.New(b, "field-peer")
	netns.Veth(b, node, "eth0", peer, "eth0")
	peer.Addr(b, "eth0", peerIP+"/16")
	node.Addr(b, "eth0", NodeIP(0).String()+"/16")
	node.Route(b, "default", "via", peerIP)
	return node, peer
}

// podNS is a pod of Node 0: its own namespace on the node's bridge.
func podNS(b *testing.B, node *netns.NS, name, ip string) *netns.NS {
	p := netns.New(b, name)
	netns.Veth(b, node, "v"+name, p, "eth0")
	node.Attach(b, "v"+name, bridge)
	p.Addr(b, "eth0", ip+"/24")
	p.Route(b, "default", "via", gatewayIP)
	return p
}

// get fetches a URL served inside ns.
func get(ns *netns.NS, url string) (string, error) {
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(_ context.Context, network, addr string) (net.Conn, error) { return ns.Dial(network, addr) },
	}}
	defer client.CloseIdleConnections()
	code, body, err := framework.HTTPGet(client, url)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("%s: %d %s", url, code, body)
	}
	return body, err
}

// saveHeap writes the node role's heap profile into
// $NETPLANE_BENCH_PROFILES, when set, as heap-<name>.pb.gz.
func saveHeap(b *testing.B, ns *netns.NS, name string) {
	dir := os.Getenv("NETPLANE_BENCH_PROFILES")
	if dir == "" {
		return
	}
	body, err := get(ns, "http://"+pprofAddr+"/debug/pprof/heap")
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "heap-"+name+".pb.gz"), []byte(body), 0o644)
	}
	if err != nil {
		b.Logf("heap profile %s: %v", name, err)
	}
}

// metric is the value of an unlabelled metric, or of the first series of
// a labelled one.
func metric(body, name string) (float64, bool) {
	for line := range strings.SplitSeq(body, "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && (f[0] == name || strings.HasPrefix(f[0], name+"{")) {
			v, err := strconv.ParseFloat(f[1], 64)
			return v, err == nil
		}
	}
	return 0, false
}

var tookRe = regexp.MustCompile(`took="([^"]+)"`)

// waitLog waits for the first line containing must, up to limit.
func waitLog(b *testing.B, p *framework.Process, limit time.Duration, must ...string) (time.Time, string) {
	var at time.Time
	var line string
	err := framework.Poll(benchCtx(b), 20*time.Millisecond, limit, strings.Join(must, " "), func(context.Context) error {
		if at, line = framework.LogLine(p.Log, false, must...); !at.IsZero() {
			return nil
		}
		if p.Exited() {
			return framework.Final(fmt.Errorf("%s exited", p.Name))
		}
		return fmt.Errorf("not logged yet")
	})
	if err != nil {
		b.Fatalf("%v; log tail:\n%s", err, p.Tail(30))
	}
	return at, line
}

// took is a "synced" line's took="…".
func took(line string) time.Duration {
	m := tookRe.FindStringSubmatch(line)
	if m == nil {
		return 0
	}
	d, _ := time.ParseDuration(m[1])
	return d
}

// percentiles are a sample's p50 and p99.
func percentiles(d []time.Duration) (p50, p99 time.Duration) {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2], s[min(len(s)-1, len(s)*99/100)]
}

// relabel sets label rev on a pod: a change every node role's pod watch
// carries.
func relabel(ctx context.Context, c kubernetes.Interface, namespace, name string, rev int) error {
	patch := fmt.Appendf(nil, `{"metadata":{"labels":{"rev":"r%d"}}}`, rev)
	_, err := c.CoreV1().Pods(namespace).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

// benchCtx is a context for the benchmark's calls and waits, which at the
// full sizes last longer than the framework's minute.
func benchCtx(b *testing.B) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Hour)
	b.Cleanup(cancel)
	return ctx
}
