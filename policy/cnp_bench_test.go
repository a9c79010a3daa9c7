package policy

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
	"github.com/netplane/netplane/nft"
)

// ClusterNetworkPolicy at the scale of the NetworkPolicy bounds
// (bench_test.go: 1,000 NetworkPolicies × 10,000 pods, 100 nodes): 100
// ClusterNetworkPolicies of 10 rules each, 50 Admin and 50 Baseline, each
// with a Pass rule first. One in five selects every namespace, the others
// one team's namespaces; their rules are those administrators write: let
// the system namespace through to the next tier, deny a team's pods, accept
// production namespaces on a port, a named port and a UDP range, deny the
// metadata address and a private range, accept the database tier and the
// nodes. Bounds: a change reaches the kernel within 50 ms at p99; the
// first packet of a connection is within 1.1× of no policy.

func scaleCNP(c int) *cnpv1.ClusterNetworkPolicy {
	tier := cnpv1.AdminTier
	if c >= 50 {
		tier = cnpv1.BaselineTier
	}
	subject := cnpv1.ClusterNetworkPolicySubject{Namespaces: sel("team", fmt.Sprintf("team-%d", c%10))}
	if c%5 == 0 {
		subject = cnpv1.ClusterNetworkPolicySubject{Namespaces: &metav1.LabelSelector{}}
	}
	p := cnpObject(fmt.Sprintf("cnp-%d", c), tier, int32(c%50*20), subject)
	team := func(k int) cnpv1.ClusterNetworkPolicyEgressPeer {
		return cnpv1.ClusterNetworkPolicyEgressPeer{Pods: &cnpv1.NamespacedPod{NamespaceSelector: *sel("team", fmt.Sprintf("team-%d", k%10)),
			PodSelector: *sel("app", fmt.Sprintf("app-%d", c%10))}}
	}
	prod := cnpv1.ClusterNetworkPolicyEgressPeer{Namespaces: sel("env", "prod")}
	system := cnpv1.ClusterNetworkPolicyEgressPeer{Namespaces: sel("kubernetes.io/metadata.name", "ns-0")}
	from(p, actPass, cnpPeers(system))
	from(p, actDeny, cnpPeers(team(c+3)))
	from(p, actAccept, cnpPeers(prod), tcpPort(8080))
	from(p, actAccept, cnpPeers(prod), namedPortOf("metrics"))
	from(p, actDeny, cnpPeers(team(c+1)), udpRange(1000, 2000))
	to(p, actPass, cnpPeers(system), namedPortOf("dns"))
	to(p, actDeny, cnpPeers(networks("169.254.169.254/32")))
	to(p, actAccept, cnpPeers(cnpv1.ClusterNetworkPolicyEgressPeer{Pods: &cnpv1.NamespacedPod{PodSelector: *sel("tier", "db")}}), tcpPort(5432))
	to(p, actDeny, cnpPeers(networks("10.200.0.0/16")), cnpv1.ClusterNetworkPolicyProtocol{TCP: &cnpv1.ClusterNetworkPolicyProtocolTCP{
		DestinationPort: &cnpv1.Port{Range: &cnpv1.PortRange{Start: 1, End: 1024}}}})
	to(p, actAccept, cnpPeers(cnpv1.ClusterNetworkPolicyEgressPeer{Nodes: sel("node-role.kubernetes.io/worker", "")}), tcpPort(10250))
	return p
}

// clusterScale is the 100 policies compiled and the 100 nodes.
func clusterScale(tb testing.TB) ([]*ClusterPolicy, []*Node) {
	var pols []*ClusterPolicy
	for c := range 100 {
		p, err := CompileCluster(scaleCNP(c))
		if err != nil {
			tb.Fatal(err)
		}
		pols = append(pols, p)
	}
	var nodes []*Node
	for i := range 100 {
		nodes = append(nodes, &Node{Name: fmt.Sprintf("n%d", i), Labels: map[string]string{"node-role.kubernetes.io/worker": ""},
			IPs: []netip.Addr{netip.AddrFrom4([4]byte{192, 168, byte(i / 250), byte(1 + i%250)})}})
	}
	return pols, nodes
}

func addCluster(m *Model, pols []*ClusterPolicy, nodes []*Node) {
	for _, n := range nodes {
		m.UpsertNode(n)
	}
	for _, p := range pols {
		m.UpsertClusterPolicy(p)
	}
}

// BenchmarkClusterChangeToKernelAtScale: after a full sync of both kinds
// of policy, one change at a time is made in the model, rendered and
// synced into a fresh network namespace's kernel; it reports the p50 and
// p99 of that time over the iterations (each change and its undo count).
func BenchmarkClusterChangeToKernelAtScale(b *testing.B) {
	framework.RequireRoot(b)
	s := newScale(b, 100, 100, 10, 100, false)
	pols, nodes := clusterScale(b)
	changed := *pols[7] // an Admin policy of team-7 with another rule order
	changed.Rules[Ingress] = append([]ClusterRule{pols[7].Rules[Ingress][2]}, pols[7].Rules[Ingress][:2]...)
	newPol, err := CompileCluster(scaleCNP(100 + 3))
	if err != nil {
		b.Fatal(err)
	}
	newPol.Name = "cnp-new"
	local := *s.pods[0]
	local.Labels = map[string]string{"app": "app-3", "tier": "db", "pod-template-hash": "h0"}
	relabelled := *s.namespaces[3]
	relabelled.Labels = map[string]string{"kubernetes.io/metadata.name": "ns-3", "team": "team-4", "env": "dev"}
	np := newSelectorPolicy(b)
	node := *nodes[5]
	node.IPs = []netip.Addr{netip.MustParseAddr("192.168.9.9")}
	changes := []struct {
		name     string
		do, undo func(m *Model)
	}{
		{"cluster policy created", func(m *Model) { m.UpsertClusterPolicy(newPol) }, func(m *Model) { m.DeleteClusterPolicy(newPol.Name) }},
		{"cluster policy's rules reordered", func(m *Model) { m.UpsertClusterPolicy(&changed) }, func(m *Model) { m.UpsertClusterPolicy(pols[7]) }},
		{"namespace relabelled into another team", func(m *Model) { m.UpsertNamespace(&relabelled) }, func(m *Model) { m.UpsertNamespace(s.namespaces[3]) }},
		{"local pod relabelled", func(m *Model) { m.UpsertPod(&local) }, func(m *Model) { m.UpsertPod(s.pods[0]) }},
		{"node address changed", func(m *Model) { m.UpsertNode(&node) }, func(m *Model) { m.UpsertNode(nodes[5]) }},
		// The control: NetworkPolicy's own change, in the same table and run.
		{"NetworkPolicy created", func(m *Model) { m.UpsertPolicy(np) }, func(m *Model) { m.DeletePolicy(np.Key()) }},
	}
	for _, ch := range changes {
		b.Run(ch.name, func(b *testing.B) {
			d, closeNS, err := nft.NamespaceDialer(netns.New(b, "cnpbench").Path)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { closeNS() })
			k := nft.NewProgrammer(d, TableID)
			defer k.Close()
			m := NewModel(Config{Node: "n0"})
			s.addTo(m)
			addCluster(m, pols, nodes)
			m.TakeTouched()
			r := newRenderer(m.Table())
			if _, err := k.Sync(r.full(), true); err != nil {
				b.Fatal(err)
			}
			took := changeLoop(b, k, m, r, ch.do, ch.undo)
			b.ReportMetric(float64(percentile(took, 50).Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(percentile(took, 99).Microseconds())/1000, "p99-ms")
			b.ReportMetric(float64(len(m.Table().Chains)), "chains")
		})
	}
}

// changeLoop makes do and undo in turn, each rendered and synced, for the
// benchmark's iterations, and returns how long each took.
func changeLoop(b *testing.B, k nft.Syncer, m *Model, r *renderer, do, undo func(*Model)) []time.Duration {
	var took []time.Duration
	i := 0
	for b.Loop() {
		start := time.Now()
		if i%2 == 0 {
			do(m)
		} else {
			undo(m)
		}
		i++
		if _, err := k.SyncTouched(r.t, r.apply(m.TakeTouched())); err != nil {
			b.Fatal(err)
		}
		took = append(took, time.Since(start))
	}
	return took
}

// BenchmarkKernelConnectWithClusterPolicies is BenchmarkKernelConnectAtScale's
// 1,000 × 10,000 table with the 100 ClusterNetworkPolicies added, 20 of
// which select the lab's namespaces: y/b's first packet to x/a goes
// through its egress Baseline chain and x/a's Admin chain (neither
// decides) before x/a's NetworkPolicy chain allows it.
func BenchmarkKernelConnectWithClusterPolicies(b *testing.B) {
	pols, nodes := clusterScale(b)
	connectBenchWith(b, true, func(l *lab) {
		addCluster(l.c.models["n1"], pols, nodes)
		m := l.c.models["n1"]
		for _, a := range []string{"10.244.0.2", "10.244.0.5"} {
			addr := netip.MustParseAddr(a)
			for _, d := range directions {
				if c := m.Table().Chains[m.vmap[d][addr]]; c != nil {
					b.Logf("%s %s: chain %s, %d rules", a, d, c.Name, len(c.Rules))
				}
			}
		}
	})
}
