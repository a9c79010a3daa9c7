package explain

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/netplane/netplane/nodeview"
	"github.com/netplane/netplane/policy"
)

// Random clusters on the two test nodes (namespaces and pods with random
// labels and named ports, NetworkPolicies of every peer and port form, in
// half of them an Admin and a Baseline ClusterNetworkPolicy) and
// random flows between pods and to and from addresses outside: explain's
// verdict and the policies it names must be the policy model's, built
// apart from explain from the same objects. The policy package checks the
// model against the API reading and the kernel (TestKernelDoesWhatTheTraceSays).

// drawn is one random cluster and the policy model of each node.
type drawn struct {
	r      *rand.Rand
	pods   []*v1.Pod
	nss    []*v1.Namespace
	pols   []*netv1.NetworkPolicy
	cnps   []*cnpv1.ClusterNetworkPolicy
	models map[string]*policy.Model
}

func (w *drawn) pick(s ...string) string { return s[w.r.IntN(len(s))] }

// labelsFrom draws some of the keys of space, each with one of its values.
func (w *drawn) labelsFrom(space map[string][]string) map[string]string {
	out := map[string]string{}
	for _, k := range []string{"app", "tier", "team"} {
		if vs, ok := space[k]; ok && w.r.IntN(3) > 0 {
			out[k] = w.pick(vs...)
		}
	}
	return out
}

var (
	drawnPodLabels = map[string][]string{"app": {"web", "db"}, "tier": {"fe", "be"}}
	drawnNSLabels  = map[string][]string{"team": {"red", "blue"}}
	// drawnBlocks cut through the pods' subnets with their exceptions.
	drawnBlocks = []netv1.IPBlock{{CIDR: "10.244.0.0/16", Except: []string{"10.244.1.0/24"}},
		{CIDR: "10.244.1.0/24", Except: []string{"10.244.1.12/31"}}, {CIDR: "0.0.0.0/0", Except: []string{"10.244.2.0/25", "172.16.1.0/24"}},
		{CIDR: "172.16.0.0/16"}}
	drawnOutside = []string{"172.16.1.5", "172.16.2.5", "192.0.2.7"}
)

func draw(seed uint64) *drawn {
	w := &drawn{r: rand.New(rand.NewPCG(seed, 7)), models: map[string]*policy.Model{}}
	for _, ns := range []string{"x", "y", "z"} {
		l := w.labelsFrom(drawnNSLabels)
		l["ns"] = ns // what cnp's subjects and fromNS select
		w.nss = append(w.nss, namespace(ns, l))
		for i := range 2 + w.r.IntN(2) {
			n := 1 + w.r.IntN(2)
			var ports []v1.ContainerPort
			if w.r.IntN(2) == 0 {
				ports = append(ports, v1.ContainerPort{Name: w.pick("http", "web"), ContainerPort: int32(79 + w.r.IntN(3)), Protocol: v1.ProtocolTCP})
			}
			if w.r.IntN(2) == 0 {
				ports = append(ports, v1.ContainerPort{Name: "dns", ContainerPort: 53, Protocol: v1.ProtocolUDP})
			}
			ip := fmt.Sprintf("10.244.%d.%d", n, 10+len(w.pods))
			p := pod(ns, fmt.Sprint("p", i), fmt.Sprint("n", n), ip, w.labelsFrom(drawnPodLabels), ports...)
			if w.r.IntN(12) == 0 {
				p.Status.Phase = v1.PodSucceeded
			}
			w.pods = append(w.pods, p)
		}
	}
	for i := range 1 + w.r.IntN(4) {
		w.pols = append(w.pols, w.policy(fmt.Sprint("np", i)))
	}
	if seed%2 == 1 { // half the clusters have ClusterNetworkPolicies too
		w.cnps = append(w.cnps, w.clusterPolicy("admin", cnpv1.AdminTier), w.clusterPolicy("baseline", cnpv1.BaselineTier))
	}
	for _, n := range testNodes {
		m := policy.NewModel(policy.Config{Node: n.Name, Families: []nodeview.Family{nodeview.IPv4}})
		for _, ns := range w.nss {
			m.UpsertNamespace(policy.NamespaceFromAPI(ns))
		}
		for _, p := range w.pods {
			m.UpsertPod(policy.PodFromAPI(p))
		}
		for _, np := range w.pols {
			m.UpsertPolicy(must(policy.Compile(np)))
		}
		for _, node := range testNodes {
			m.UpsertNode(policy.NodeFromAPI(node))
		}
		for _, cp := range w.cnps {
			m.UpsertClusterPolicy(must(policy.CompileCluster(cp)))
		}
		w.models[n.Name] = m
	}
	return w
}

// clusterPolicy is a policy of tier over one namespace's pods with up to
// three ingress rules from namespaces, each Accept, Deny or Pass.
func (w *drawn) clusterPolicy(name string, tier cnpv1.Tier) *cnpv1.ClusterNetworkPolicy {
	var rules []cnpv1.ClusterNetworkPolicyIngressRule
	for range w.r.IntN(4) {
		action := []cnpv1.ClusterNetworkPolicyRuleAction{cnpv1.ClusterNetworkPolicyRuleActionAccept,
			cnpv1.ClusterNetworkPolicyRuleActionDeny, cnpv1.ClusterNetworkPolicyRuleActionPass}[w.r.IntN(3)]
		rules = append(rules, fromNS(action, "", w.pick("x", "y", "z")))
	}
	return cnp(name, tier, int32(w.r.IntN(10)), w.pick("x", "y", "z"), rules...)
}

// must is v; the drawn objects are valid.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func (w *drawn) policy(name string) *netv1.NetworkPolicy {
	types := [][]netv1.PolicyType{nil, ingressOnly, egressOnly, {netv1.PolicyTypeIngress, netv1.PolicyTypeEgress}}[w.r.IntN(4)]
	var in []netv1.NetworkPolicyIngressRule
	var out []netv1.NetworkPolicyEgressRule
	for range w.r.IntN(3) {
		in = append(in, netv1.NetworkPolicyIngressRule{From: w.peers(), Ports: w.ports()})
	}
	for range w.r.IntN(3) {
		out = append(out, netv1.NetworkPolicyEgressRule{To: w.peers(), Ports: w.ports()})
	}
	return netpol(w.pick("x", "y", "z"), name, w.labelsFrom(drawnPodLabels), types, in, out)
}

// peers draws up to two peers: pods, namespaces, both, or an ipBlock.
func (w *drawn) peers() []netv1.NetworkPolicyPeer {
	forms := []func() netv1.NetworkPolicyPeer{
		func() netv1.NetworkPolicyPeer { return fromPods(w.labelsFrom(drawnPodLabels)) },
		func() netv1.NetworkPolicyPeer { return fromNamespaces(w.labelsFrom(drawnNSLabels)) },
		func() netv1.NetworkPolicyPeer {
			p := fromPods(w.labelsFrom(drawnPodLabels))
			p.NamespaceSelector = &metav1.LabelSelector{MatchLabels: w.labelsFrom(drawnNSLabels)}
			return p
		},
		func() netv1.NetworkPolicyPeer {
			return netv1.NetworkPolicyPeer{IPBlock: &drawnBlocks[w.r.IntN(len(drawnBlocks))]}
		},
	}
	out := make([]netv1.NetworkPolicyPeer, w.r.IntN(3))
	for i := range out {
		out[i] = forms[w.r.IntN(len(forms))]()
	}
	return out
}

func (w *drawn) ports() []netv1.NetworkPolicyPort {
	var out []netv1.NetworkPolicyPort
	for range w.r.IntN(3) {
		proto := []v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP}[w.r.IntN(2)]
		p := netv1.NetworkPolicyPort{Protocol: &proto}
		switch w.r.IntN(4) {
		case 0:
			n := intstr.FromInt32(int32(79 + w.r.IntN(3)))
			p.Port = &n
		case 1:
			n, end := intstr.FromInt32(int32(53+w.r.IntN(27))), int32(80+w.r.IntN(2))
			p.Port, p.EndPort = &n, &end
		case 2:
			n := intstr.FromString(w.pick("http", "web", "dns"))
			p.Port = &n
		}
		out = append(out, p)
	}
	return out
}

// question is a random flow: pod to pod, address to pod, or pod to address.
func (w *drawn) question() *Input {
	in := &Input{Pods: w.pods, Namespaces: w.nss, Policies: w.pols, ClusterPolicies: w.cnps, Nodes: testNodes,
		Overlay: Overlay{Settings: nodeview.Settings{Overlay: "always"}},
		Port:    PortQuery{Number: []int{53, 79, 80, 81}[w.r.IntN(4)], Protocol: []v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP}[w.r.IntN(2)]}}
	from, to := w.pods[w.r.IntN(len(w.pods))], w.pods[w.r.IntN(len(w.pods))]
	for to == from {
		to = w.pods[w.r.IntN(len(w.pods))]
	}
	in.FromPod, in.ToPod, in.To = from, to, to.Namespace+"/"+to.Name
	switch w.r.IntN(4) {
	case 0:
		in.FromPod, in.FromIP = nil, addr(w.pick(drawnOutside...))
	case 1:
		in.ToPod, in.ToIP = nil, addr(w.pick(drawnOutside...))
		in.To = in.ToIP.String()
	}
	return in
}

// modelSays is the models' decision of one direction (allowed when no
// pod's policies count for it), and the effects explain must name for it:
// the rules of the tiers the flow meets, in the order the pod's chains run
// them (Admin; NetworkPolicy when one isolates the pod, else Baseline).
func (w *drawn) modelSays(self *v1.Pod, peer netip.Addr, in *Input, dir policy.Direction, dirName string) (bool, []PolicyEffect) {
	if self == nil {
		return true, nil
	}
	d := w.models[self.Spec.NodeName].Trace(policy.Flow{Dir: dir, Pod: types.NamespacedName{Namespace: self.Namespace, Name: self.Name},
		Peer: peer, Proto: protoNumber(in.Port.Protocol), Port: uint16(in.Port.Number)})
	var eff []PolicyEffect
	if d.Admin.Action != 0 {
		eff = append(eff, clusterEffect(d.Admin, dirName))
		if d.Admin.Action != policy.ActionPass {
			return d.Allowed, eff
		}
	}
	for _, iso := range d.Isolations {
		eff = append(eff, effect(iso.Policy.Namespace, iso.Policy.Name, dirName, Isolates, 0))
		if iso.Rule >= 0 {
			eff = append(eff, effect(iso.Policy.Namespace, iso.Policy.Name, dirName, Allows, iso.Rule+1))
		}
	}
	if !d.Isolated() && d.Baseline.Action != 0 {
		eff = append(eff, clusterEffect(d.Baseline, dirName))
	}
	return d.Allowed, eff
}

func ipOf(p *v1.Pod, ip netip.Addr) netip.Addr {
	if p != nil {
		return addr(p.Status.PodIP)
	}
	return ip
}

func TestExplainSaysWhatThePolicyModelSays(t *testing.T) {
	flows, denied := 0, 0
	for seed := range uint64(200) {
		w := draw(seed)
		for range 30 {
			in := w.question()
			src, dst := ipOf(in.FromPod, in.FromIP), ipOf(in.ToPod, in.ToIP)
			egressOK, egressEff := w.modelSays(in.FromPod, dst, in, policy.Egress, DirEgress)
			ingressOK, ingressEff := w.modelSays(in.ToPod, src, in, policy.Ingress, DirIngress)
			want := verdictOf(egressOK && ingressOK)
			if in.FromPod != nil && in.ToPod != nil {
				// The nodes' tables, run through their hooks, agree.
				tableOK := true
				for _, n := range slices.Compact([]string{in.FromPod.Spec.NodeName, in.ToPod.Spec.NodeName}) {
					pkt := policy.Packet{Hook: "forward", Src: src, Dst: dst, Proto: protoNumber(in.Port.Protocol), Port: uint16(in.Port.Number)}
					tableOK = tableOK && w.models[n].Table().Trace(pkt).Accepted
				}
				if verdictOf(tableOK) != want {
					t.Fatalf("seed %d: %s -> %s: the model's trace says %s, its tables %s", seed, src, dst, want, verdictOf(tableOK))
				}
			}
			x, err := Explain(in)
			if err != nil {
				t.Fatalf("seed %d: %s -> %s: %v", seed, src, in.To, err)
			}
			flows++
			if want == Denied {
				denied++
			}
			b := x.Backends[0]
			wantEff := effectsOrEmpty(append(egressEff, ingressEff...))
			if b.Verdict != want || !slices.Equal(b.Policies, wantEff) {
				t.Fatalf("seed %d: %s -> %s %s/%d: explain says %s %+v (%s; %s), the policy model %s %+v\npolicies: %+v",
					seed, src, in.To, in.Port.Protocol, in.Port.Number, b.Verdict, b.Policies, b.Egress, b.Ingress, want, wantEff, w.pols)
			}
		}
	}
	t.Logf("%d flows, %d denied", flows, denied)
	if denied == 0 || denied == flows {
		t.Fatalf("%d of %d flows denied: the draw decides nothing", denied, flows)
	}
}
