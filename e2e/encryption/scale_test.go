package encryption

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/wireguard"
)

// BenchmarkNewNodePeer measures, through the node role beside 1,000
// keyed Nodes, the time from a new Node's creation in the API server to
// its peer in the agent's WireGuard device (the agent's peer count, which
// each sync sets once the device took the change), for newNodes Nodes one
// after another; and how long the agent took to have all 1,000 once they
// were created. A new Node comes after a quiet spell, as Nodes join a
// cluster. Run it with -benchtime 1x.
func BenchmarkNewNodePeer(b *testing.B) {
	const scale, newNodes = 1000, 20
	logLoad(b)
	defer logLoad(b)
	c := newCluster(b, 2, v1alpha1.EncryptionWireGuard)
	agent := c.nodes[0]
	peers := func() int {
		up, err1 := agent.Metric("netplane_wireguard_peers", `state="up"`)
		stale, err2 := agent.Metric("netplane_wireguard_peers", `state="stale"`)
		if err1 != nil || err2 != nil {
			return -1
		}
		return int(up + stale)
	}
	waitPeers := func(want int, limit time.Duration) time.Duration {
		start := time.Now()
		for peers() != want {
			if time.Since(start) > limit {
				b.Fatalf("%d peers after %v, want %d", peers(), limit, want)
			}
			time.Sleep(2 * time.Millisecond)
		}
		return time.Since(start)
	}
	base := peers()
	// Node i: a key, a /27 of the cluster CIDR beyond the pod nodes' /24s,
	// an InternalIP no packet is sent to (no traffic, so no handshake).
	node := func(i int) (*v1.Node, string) {
		k, err := wgtypes.GeneratePrivateKey()
		if err != nil {
			b.Fatal(err)
		}
		cidr := fmt.Sprintf("10.244.%d.%d/27", 16+i/8, i%8*32)
		return &v1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("scale-%04d", i), Annotations: map[string]string{wireguard.Annotation: k.PublicKey().String()}},
			Spec:       v1.NodeSpec{PodCIDR: cidr, PodCIDRs: []string{cidr}},
		}, fmt.Sprintf("172.16.%d.%d", i/250, i%250+1)
	}
	for b.Loop() {
		start := time.Now()
		var wg sync.WaitGroup
		work := make(chan int)
		for range 8 {
			wg.Go(func() {
				for i := range work {
					c.createNode(node(i))
				}
			})
		}
		for i := range scale {
			work <- i
		}
		close(work)
		wg.Wait()
		created := time.Since(start)
		all := waitPeers(base+scale, 2*time.Minute)
		b.Logf("%d Nodes created in %v; all their peers in the device %v after the last was created", scale, created.Round(time.Millisecond), all.Round(time.Millisecond))
		var took []time.Duration
		for i := range newNodes {
			// Nodes join a cluster seconds apart, not back to back: a quiet
			// spell refills the sync loop's burst (--min-sync-period, 100
			// ms, burst 2), which a stream of Node writes would spend, each
			// then waiting its 100 ms turn.
			time.Sleep(500 * time.Millisecond)
			start := time.Now()
			c.createNode(node(scale + i))
			waitPeers(base+scale+i+1, 10*time.Second)
			took = append(took, time.Since(start))
		}
		slices.Sort(took)
		p50, worst := took[len(took)/2], took[len(took)-1]
		b.ReportMetric(float64(p50.Microseconds())/1000, "ms-p50")
		b.ReportMetric(float64(worst.Microseconds())/1000, "ms-max")
		b.Logf("a new Node's peer in the device beside %d: p50 %v, max of %d (their p99) %v, from the Node's creation (its status write included)",
			scale, p50.Round(100*time.Microsecond), newNodes, worst.Round(100*time.Microsecond))
		// A restarted agent: a new device (userspace), every peer again.
		agent.Proc.Stop(10 * time.Second)
		start = time.Now()
		c.run(agent, v1alpha1.EncryptionWireGuard)
		all = waitPeers(base+scale+newNodes, time.Minute)
		b.ReportMetric(all.Seconds(), "s-restart")
		b.Logf("a restarted agent had all %d peers in a new device %v after its process started (%v after its metrics server answered)",
			base+scale+newNodes, time.Since(start).Round(time.Millisecond), all.Round(time.Millisecond))
	}
}
