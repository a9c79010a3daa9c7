package policy

import (
	"net/netip"
	"regexp"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/netplane/netplane/nodeview"
)

// Properties of the layout beyond the verdicts: what is shared, what is
// left out, what a dump looks like.

var hashes = regexp.MustCompile(`-[0-9a-f]{16}`)

func setsNamed(t *Table, prefix string) []string {
	var out []string
	for name := range t.Sets {
		if strings.HasPrefix(name, prefix) {
			out = append(out, name)
		}
	}
	return out
}

func TestEqualSelectorsShareOneSetUntilTheLastUserGoes(t *testing.T) {
	c := newModelCluster()
	m := c.models["n1"]
	blue := func(ns string) *netv1.NetworkPolicy {
		return policy(ns, "p", netv1.NetworkPolicySpec{PodSelector: *all,
			Ingress: []netv1.NetworkPolicyIngressRule{ingress(peers(nsPeer(&metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: "team", Operator: metav1.LabelSelectorOpIn, Values: []string{"blue", "red"}}, {Key: "team", Operator: metav1.LabelSelectorOpExists}}})))}})
	}
	c.setPolicy(t, blue("x"))
	y := blue("y")
	exprs := y.Spec.Ingress[0].From[0].NamespaceSelector.MatchExpressions
	exprs[0].Values = []string{"red", "blue"}
	exprs[0], exprs[1] = exprs[1], exprs[0] // the same selector written in another order
	c.setPolicy(t, y)
	if got := setsNamed(m.Table(), "sel-"); len(got) != 1 {
		t.Fatalf("two policies with one selector: sets %v, want one", got)
	}
	c.deletePolicy(podKey("x", "p"))
	if got := setsNamed(m.Table(), "sel-"); len(got) != 1 {
		t.Fatalf("one of two users deleted: sets %v, want the one kept", got)
	}
	c.deletePolicy(podKey("y", "p"))
	if got := setsNamed(m.Table(), "sel"); len(got) != 0 {
		t.Fatalf("both users deleted: sets %v left", got)
	}
}

func TestPodsWithTheSameRulesShareAGroupChain(t *testing.T) {
	c := newModelCluster()
	c.setPolicy(t, policy("x", "p", netv1.NetworkPolicySpec{PodSelector: *all,
		Ingress: []netv1.NetworkPolicyIngressRule{ingress(nil, namedPort(tcp, "serve-80-tcp"))}}))
	chains := func() map[string]bool {
		out := map[string]bool{}
		for name := range c.models["n1"].Table().Chains {
			if strings.HasPrefix(name, "ingress-") {
				out[name] = true
			}
		}
		return out
	}
	if got := chains(); len(got) != 1 {
		t.Errorf("x/a, x/b, x/c with the same rules: chains %v, want one", got)
	}
	p := modelPod("x", "c")
	p.Spec.Containers[0].Ports[0].ContainerPort = 8080 // serve-80-tcp resolves elsewhere
	c.setPod(p)
	if got := chains(); len(got) != 2 {
		t.Errorf("x/c's named port resolving to another number: chains %v, want two", got)
	}
}

func TestHostNetworkPodsAreNeitherEnforcedNorPeers(t *testing.T) {
	c := newModelCluster()
	c.setPolicy(t, policy("x", "p", netv1.NetworkPolicySpec{PodSelector: *all, PolicyTypes: bothTypes,
		Ingress: []netv1.NetworkPolicyIngressRule{ingress(peers(podPeer(all)))}}))
	h := modelPod("x", "h")
	h.Spec.HostNetwork = true
	h.Status.PodIPs = []v1.PodIP{{IP: "192.168.0.1"}}
	c.setPod(h)
	dump := c.models["n1"].Table().Dump()
	if strings.Contains(dump, "192.168.0.1") {
		t.Errorf("the hostNetwork pod's address is in the table:\n%s", dump)
	}
}

func TestTwoLocalPodsWithOneAddressUseTheFirstClaimant(t *testing.T) {
	c := newModelCluster()
	c.setPolicy(t, policy("x", "p", netv1.NetworkPolicySpec{PodSelector: *sel("pod", "a"), PolicyTypes: ingressOnly}))
	d := modelPod("y", "d")
	d.Status.PodIPs = modelPod("x", "a").Status.PodIPs // x/a's addresses
	c.setPod(d)
	m := c.models["n1"]
	a := netip.MustParseAddr("10.0.1.1")
	if m.vmap[Ingress][a] == "" {
		t.Fatalf("x/a, isolated and first, lost its map element to y/d")
	}
	c.deletePod(podKey("x", "a"))
	if got := m.vmap[Ingress][a]; got != "" {
		t.Errorf("x/a gone: the address still jumps to %s, want nothing (y/d is not isolated)", got)
	}
	if got := m.claims[a]; len(got) != 1 {
		t.Errorf("claims of %s: %d, want y/d's", a, len(got))
	}
}

func TestNeighborDiscoveryIsNotJudged(t *testing.T) {
	c := newModelCluster()
	c.setPolicy(t, policy("x", "deny", netv1.NetworkPolicySpec{PodSelector: *all, PolicyTypes: bothTypes}))
	tab := c.models["n1"].Table()
	src, dst := netip.MustParseAddr("fd00::1:1"), netip.MustParseAddr("fd00::1:2")
	for _, tc := range []struct {
		icmp uint8
		want bool
	}{{135, true}, {136, true}, {133, true}, {128, false}} {
		tr := tab.Trace(Packet{Hook: "forward", Src: src, Dst: dst, Proto: unix.IPPROTO_ICMPV6, ICMPType: tc.icmp})
		if tr.Accepted != tc.want {
			t.Errorf("ICMPv6 type %d between isolated pods: accepted=%v, want %v; trace %v", tc.icmp, tr.Accepted, tc.want, tr.Steps)
		}
	}
}

// dbModel is one node's model: x/a (here, app=db, a named port sql) admits
// app=web pods and an ipBlock on sql; with egress, it may reach sql of
// any pod and nothing else.
func dbModel(t *testing.T, egressToo bool) *Model {
	m := NewModel(Config{Node: "n1", Families: []nodeview.Family{nodeview.IPv4}})
	m.UpsertNamespace(&Namespace{Name: "x", Labels: map[string]string{"team": "a"}})
	m.UpsertPod(&Pod{Namespace: "x", Name: "a", Node: "n1", Labels: map[string]string{"app": "db"},
		IPs: []netip.Addr{netip.MustParseAddr("10.0.0.2")}, Ports: []NamedPort{{Name: "sql", Protocol: unix.IPPROTO_TCP, Port: 5432}}})
	m.UpsertPod(&Pod{Namespace: "x", Name: "b", Node: "n2", Labels: map[string]string{"app": "web"}, IPs: []netip.Addr{netip.MustParseAddr("10.0.1.2")}})
	sqlPort := intstr.FromString("sql")
	spec := netv1.NetworkPolicySpec{PodSelector: *sel("app", "db"), Ingress: []netv1.NetworkPolicyIngressRule{
		{From: peers(podPeer(sel("app", "web")), blockPeer("192.0.2.0/24", "192.0.2.0/25")), Ports: []netv1.NetworkPolicyPort{{Port: &sqlPort}}}}}
	if egressToo {
		spec.PolicyTypes = bothTypes
		spec.Egress = []netv1.NetworkPolicyEgressRule{egress(peers(podPeer(all)), namedPort(tcp, "sql"))}
	}
	pol, err := Compile(policy("x", "db", spec))
	if err != nil {
		t.Fatal(err)
	}
	m.UpsertPolicy(pol)
	return m
}

func TestDumpReadsLikeNft(t *testing.T) {
	m := dbModel(t, false)
	want := `add table inet netplane-policy
add chain inet netplane-policy deny-egress
add chain inet netplane-policy deny-ingress
add chain inet netplane-policy forward { type filter hook forward priority 0 ; policy accept ; }
add chain inet netplane-policy ingress-HASH
add chain inet netplane-policy input { type filter hook input priority 0 ; policy accept ; }
add set inet netplane-policy cidr-HASH { type ipv4_addr ; flags interval ; }
add map inet netplane-policy egress-pods { type ipv4_addr : verdict ; }
add map inet netplane-policy ingress-pods { type ipv4_addr : verdict ; }
add set inet netplane-policy sel-HASH { type ipv4_addr ; }
add counter inet netplane-policy denied-egress
add counter inet netplane-policy denied-ingress
add element inet netplane-policy cidr-HASH { 192.0.2.128/25 }
add element inet netplane-policy ingress-pods { 10.0.0.2 : jump ingress-HASH }
add element inet netplane-policy sel-HASH { 10.0.1.2 }
add rule inet netplane-policy deny-egress counter name "denied-egress" drop
add rule inet netplane-policy deny-ingress counter name "denied-ingress" drop
add rule inet netplane-policy forward ct state established,related accept
add rule inet netplane-policy forward ip saddr vmap @egress-pods
add rule inet netplane-policy forward ip daddr vmap @ingress-pods
add rule inet netplane-policy ingress-HASH ip saddr @cidr-HASH meta l4proto tcp th dport 5432 return
add rule inet netplane-policy ingress-HASH ip saddr @sel-HASH meta l4proto tcp th dport 5432 return
add rule inet netplane-policy ingress-HASH goto deny-ingress
add rule inet netplane-policy input ct state established,related accept
add rule inet netplane-policy input ip saddr vmap @egress-pods
`
	got := hashes.ReplaceAllString(m.Table().Dump(), "-HASH")
	if got != want {
		t.Errorf("dump:\n%s\nwant:\n%s\ndiff:\n%s", got, want, lineDiff(want, got))
	}
}

func TestCompileNamesTheBadField(t *testing.T) {
	bad := "Bad"
	for _, tc := range []struct {
		name string
		spec netv1.NetworkPolicySpec
		want string
	}{
		{"operator", netv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Near"}}}}, "spec.podSelector"},
		{"cidr", netv1.NetworkPolicySpec{Ingress: []netv1.NetworkPolicyIngressRule{ingress(peers(blockPeer("10.0.0/8")))}}, "spec.ingress[0].from[0].ipBlock.cidr"},
		{"except family", netv1.NetworkPolicySpec{Egress: []netv1.NetworkPolicyEgressRule{egress(peers(blockPeer("10.0.0.0/8", "fd00::/64")))}}, "spec.egress[0].to[0].ipBlock.except[0]"},
		{"endPort on a name", netv1.NetworkPolicySpec{Ingress: []netv1.NetworkPolicyIngressRule{ingress(nil, func() netv1.NetworkPolicyPort {
			p := namedPort(tcp, "http")
			end := int32(90)
			p.EndPort = &end
			return p
		}())}}, "spec.ingress[0].ports[0].endPort"},
		{"endPort below port", netv1.NetworkPolicySpec{Ingress: []netv1.NetworkPolicyIngressRule{ingress(nil, portRange(tcp, 90, 80))}}, "spec.ingress[0].ports[0].endPort"},
		{"protocol", netv1.NetworkPolicySpec{Ingress: []netv1.NetworkPolicyIngressRule{ingress(nil, port(v1.Protocol(bad), 80))}}, "spec.ingress[0].ports[0].protocol"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Compile(policy("x", "p", tc.spec))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one naming %s", err, tc.want)
			}
		})
	}
}
