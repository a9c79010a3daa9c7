package policy

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
)

// labBlocks are ipBlocks over the lab's pods (10.244.0.2-5), each with
// exceptions that take some of them out.
var labBlocks = [][]string{{"10.244.0.0/24", "10.244.0.2/32"}, {"10.244.0.0/29", "10.244.0.4/31"},
	{"0.0.0.0/0", "10.244.0.3/32", "10.244.0.5/32"}, {"10.244.0.0/16"}, {"10.244.0.4/30"}}

// TestKernelDoesWhatTheTraceSays draws random clusters over the lab's four
// pods (labels, namespace labels, named ports, a finished pod now and then)
// and random NetworkPolicies with ipBlocks over the lab's addresses, loads
// each node table and makes every pod-to-pod connection on TCP and UDP 80
// and 81 (48 a cluster) for real: each must get through exactly when the
// model's trace of both directions (Model.Trace, what explain prints)
// allows it.
func TestKernelDoesWhatTheTraceSays(t *testing.T) {
	l := newLab(t)
	for seed := range uint64(8) {
		g := gen{rand.New(rand.NewPCG(seed, 6))}
		l.draw(t, g)
		l.load()
		var probes []kprobe
		for _, from := range labPods {
			for _, to := range labPods {
				for _, proto := range []v1.Protocol{tcp, udp} {
					for _, port := range []int{80, 81} {
						if from != to {
							probes = append(probes, kprobe{from: from.key, to: to.key, port: port, proto: proto})
						}
					}
				}
			}
		}
		got := l.probeAll(probes)
		bad := 0
		for i, p := range probes {
			proto, _ := protocolNumber(p.proto)
			want := traceAllows(l.c.models, l.c.endpoint(t, p.from), l.c.endpoint(t, p.to), uint16(p.port), proto)
			if got[i] != want {
				bad++
				t.Errorf("seed %d: %s -> %s %s/%d: the kernel let it through=%v, the trace says %v", seed, p.from, p.to, p.proto, p.port, got[i], want)
			}
		}
		if bad > 0 {
			t.Fatalf("seed %d: %d of %d connections differ; policies:\n%s", seed, bad, len(probes), l.c.describePolicies())
		}
	}
}

// draw replaces the lab's cluster with a random one: namespace labels, the
// pods' labels, named ports and phase (their node and addresses stay), and
// one to four policies in the pods' namespaces.
func (l *lab) draw(t *testing.T, g gen) {
	for _, ns := range modelNamespaces {
		l.c.setNamespace(g.namespace(ns))
	}
	for _, lp := range labPods {
		ns, name, _ := strings.Cut(lp.key, "/")
		p := g.pod(ns, name)
		p.Spec.NodeName = "n1"
		p.Status.PodIPs = []v1.PodIP{{IP: lp.ip}, {IP: lp.ip6}}
		l.c.setPod(p)
	}
	for key := range l.c.policies {
		l.c.deletePolicy(key)
	}
	for i := range 1 + g.r.IntN(4) {
		np := g.policy(fmt.Sprint("p", i))
		np.Namespace = g.pick("x", "y") // where the lab's pods are
		for _, r := range np.Spec.Ingress {
			g.labBlocks(r.From)
		}
		for _, r := range np.Spec.Egress {
			g.labBlocks(r.To)
		}
		l.c.setPolicy(t, np)
	}
}

// labBlocks puts the lab's blocks in place of the model's, and of some
// selectors, so that exceptions decide often.
func (g gen) labBlocks(peers []netv1.NetworkPolicyPeer) {
	for i := range peers {
		if peers[i].IPBlock != nil || g.chance(0.3) {
			b := labBlocks[g.r.IntN(len(labBlocks))]
			peers[i] = blockPeer(b[0], b[1:]...)
		}
	}
}
