package policy

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/netplane/netplane/nft"
	"github.com/netplane/netplane/nodeview"
)

func TestRenderedRulesReadLikeNft(t *testing.T) {
	core := &Table{Sets: map[string]*Set{
		"cidr-one":  {Name: "cidr-one", Family: nodeview.IPv4, Kind: RangeSet, elems: map[Element]int{{Addr: mustAddr("192.0.2.0"), End: mustAddr("192.0.2.255")}: 1}},
		"cidr-many": {Name: "cidr-many", Family: nodeview.IPv4, Kind: RangeSet, elems: map[Element]int{{Addr: mustAddr("0.0.0.0"), End: mustAddr("9.255.255.255")}: 1, {Addr: mustAddr("11.0.0.0"), End: mustAddr("11.0.0.3")}: 1}},
		"cidr-none": {Name: "cidr-none", Family: nodeview.IPv4, Kind: RangeSet, elems: map[Element]int{}},
		"sel6-ab":   {Name: "sel6-ab", Family: nodeview.IPv6, Kind: AddrSet, elems: map[Element]int{}},
	}}
	r := newRenderer(core)
	for _, tc := range []struct {
		name string
		rule Rule
		want string // "" when the rule is left out
	}{
		{"established first", Rule{Established: true, Verdict: Verdict{Kind: Accept}}, "ct state established,related accept"},
		{"neighbour discovery", Rule{NeighborDiscovery: true, Verdict: Verdict{Kind: Accept}},
			"meta nfproto ipv6 meta l4proto ipv6-icmp icmpv6 type 133-136 accept"},
		{"egress dispatch", Rule{Family: nodeview.IPv4, Field: Saddr, Vmap: "egress-pods"}, "meta nfproto ipv4 ip saddr vmap @egress-pods"},
		{"ingress dispatch IPv6", Rule{Family: nodeview.IPv6, Field: Daddr, Vmap: "ingress-pods6"}, "meta nfproto ipv6 ip6 daddr vmap @ingress-pods6"},
		{"pods of a selector on a port", Rule{Family: nodeview.IPv6, Field: Saddr, Set: "sel6-ab", Proto: unix.IPPROTO_TCP, PortFrom: 80, PortTo: 80, Verdict: Verdict{Kind: Return}},
			"meta nfproto ipv6 ip6 saddr @sel6-ab meta l4proto tcp th dport 80 return"},
		{"an ipBlock of one prefix", Rule{Family: nodeview.IPv4, Field: Daddr, Set: "cidr-one", Verdict: Verdict{Kind: Return}},
			"meta nfproto ipv4 ip daddr 192.0.2.0/24 return"},
		{"an ipBlock less its exceptions", Rule{Family: nodeview.IPv4, Field: Saddr, Set: "cidr-many", Proto: unix.IPPROTO_UDP, Verdict: Verdict{Kind: Return}},
			"meta nfproto ipv4 ip saddr { 0.0.0.0/5, 8.0.0.0/7, 11.0.0.0/30 } meta l4proto udp return"},
		{"an ipBlock its exceptions cover is left out", Rule{Family: nodeview.IPv4, Field: Saddr, Set: "cidr-none", Verdict: Verdict{Kind: Return}}, ""},
		{"a port range", Rule{Proto: unix.IPPROTO_SCTP, PortFrom: 80, PortTo: 81, Verdict: Verdict{Kind: Return}}, "meta l4proto sctp th dport 80-81 return"},
		{"a named port to pods", Rule{Family: nodeview.IPv4, Proto: unix.IPPROTO_UDP, PortSet: "nport-cd", Verdict: Verdict{Kind: Return}},
			"meta nfproto ipv4 meta l4proto udp ip daddr . meta l4proto . th dport @nport-cd return"},
		{"a named port in an ipBlock", Rule{Family: nodeview.IPv4, Field: Daddr, Set: "cidr-one", Proto: unix.IPPROTO_TCP, PortSet: "nport-cd", Verdict: Verdict{Kind: Return}},
			"meta nfproto ipv4 ip daddr 192.0.2.0/24 meta l4proto tcp ip daddr . meta l4proto . th dport @nport-cd return"},
		{"every peer", Rule{Verdict: Verdict{Kind: Return}}, "return"},
		{"end of a group chain", Rule{Verdict: Verdict{Kind: Goto, Chain: "deny-ingress"}}, "goto deny-ingress"},
		{"count and drop", Rule{Counter: "denied-egress", Verdict: Verdict{Kind: Drop}}, "counter drop"},
		{"log", Rule{Log: Log{Group: 7, Rate: 10, Prefix: "p ingress "}},
			`limit rate 10/second burst 5 packets log prefix "p ingress " group 7 snaplen 128`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := r.rule(tc.rule)
			switch {
			case tc.want == "" && ok:
				t.Errorf("rendered %q, want the rule left out", got.Text)
			case tc.want != "" && !ok:
				t.Errorf("left out, want %q", tc.want)
			case ok && got.Text != tc.want:
				t.Errorf("rendered\n  %s\nwant\n  %s", got.Text, tc.want)
			}
		})
	}
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

func TestRenderedTableDump(t *testing.T) {
	m := dbModel(t, true)
	want := `add table inet netplane-policy
add chain inet netplane-policy deny-egress
add chain inet netplane-policy deny-ingress
add chain inet netplane-policy egress-HASH
add chain inet netplane-policy forward { type filter hook forward priority 0 ; }
add chain inet netplane-policy ingress-HASH
add chain inet netplane-policy input { type filter hook input priority 0 ; }
add map inet netplane-policy egress-pods { type ipv4_addr : verdict ; }
add map inet netplane-policy ingress-pods { type ipv4_addr : verdict ; }
add set inet netplane-policy nport-HASH { type ipv4_addr . inet_proto . inet_service ; }
add set inet netplane-policy sel-HASH { type ipv4_addr ; }
add set inet netplane-policy sel-HASH { type ipv4_addr ; }
add element inet netplane-policy egress-pods { 10.0.0.2 : jump egress-HASH }
add element inet netplane-policy ingress-pods { 10.0.0.2 : jump ingress-HASH }
add element inet netplane-policy nport-HASH { 10.0.0.2 . tcp . 5432 }
add element inet netplane-policy sel-HASH { 10.0.0.2 }
add element inet netplane-policy sel-HASH { 10.0.1.2 }
add element inet netplane-policy sel-HASH { 10.0.1.2 }
add rule inet netplane-policy deny-egress counter drop
add rule inet netplane-policy deny-ingress counter drop
add rule inet netplane-policy egress-HASH meta nfproto ipv4 meta l4proto tcp ip daddr . meta l4proto . th dport @nport-HASH return
add rule inet netplane-policy egress-HASH goto deny-egress
add rule inet netplane-policy forward ct state established,related accept
add rule inet netplane-policy forward meta nfproto ipv4 ip saddr vmap @egress-pods
add rule inet netplane-policy forward meta nfproto ipv4 ip daddr vmap @ingress-pods
add rule inet netplane-policy ingress-HASH meta nfproto ipv4 ip saddr 192.0.2.128/25 meta l4proto tcp th dport 5432 return
add rule inet netplane-policy ingress-HASH meta nfproto ipv4 ip saddr @sel-HASH meta l4proto tcp th dport 5432 return
add rule inet netplane-policy ingress-HASH goto deny-ingress
add rule inet netplane-policy input ct state established,related accept
add rule inet netplane-policy input meta nfproto ipv4 ip saddr vmap @egress-pods
`
	got := hashes.ReplaceAllString(newRenderer(m.Table()).full().Dump(), "-HASH")
	if got != want {
		t.Errorf("dump:\n%s\nwant:\n%s\ndiff:\n%s", got, want, lineDiff(want, got))
	}
}

// TestIncrementalRenderingEqualsAFreshOne applies random changes and,
// after each, renders only what the model touched: the rendering must
// equal one made afresh, and what it reports touched must name every
// chain, set and element that differs from the rendering before.
func TestIncrementalRenderingEqualsAFreshOne(t *testing.T) {
	for seed := range uint64(30) {
		g := gen{rand.New(rand.NewPCG(seed, 3))}
		c := newCluster([]string{"n1"}, nil)
		m := c.models["n1"]
		r := newRenderer(m.Table())
		m.TakeTouched()
		r.full()
		for i := range 60 {
			what := g.change(t, c)
			before := renderedState(r.t)
			touched := r.apply(m.TakeTouched())
			after := renderedState(r.t)
			if missed := before.untouched(after, touched); missed != "" {
				t.Fatalf("seed %d change %d (%s): changed but not reported touched: %s", seed, i, what, missed)
			}
			if got, want := r.t.Dump(), newRenderer(m.Table()).full().Dump(); got != want {
				t.Fatalf("seed %d change %d (%s): incremental rendering differs from a fresh one:\n%s", seed, i, what, lineDiff(want, got))
			}
		}
	}
}

// renderState is a rendering's chains (their rules' texts), sets (their
// specs' key type) and elements, by name.
type renderState struct {
	chains map[string]string
	sets   map[string]string
	elems  map[string]map[string]bool
}

func renderedState(t *nft.Table) renderState {
	s := renderState{chains: map[string]string{}, sets: map[string]string{}, elems: map[string]map[string]bool{}}
	for name, c := range t.Chains {
		var texts []string
		for _, r := range c.Rules {
			texts = append(texts, r.Text)
		}
		s.chains[name] = strings.Join(texts, "\n")
	}
	for name, set := range t.Sets {
		s.sets[name] = set.Spec.Key.Name + ":" + set.Spec.Data.Name
		s.elems[name] = map[string]bool{}
		for id := range set.All() {
			s.elems[name][id] = true
		}
	}
	return s
}

func (s renderState) untouched(after renderState, tc *nft.Touched) string {
	var missed []string
	for _, name := range unionKeys(s.chains, after.chains) {
		if b, ok := s.chains[name]; (!ok || b != after.chains[name]) && !tc.Chains[name] {
			missed = append(missed, "chain "+name)
		}
	}
	for _, name := range unionKeys(s.sets, after.sets) {
		b, ok := s.sets[name]
		a, ok2 := after.sets[name]
		if ok != ok2 || b != a {
			if !tc.Sets[name] {
				missed = append(missed, "set "+name)
			}
			continue
		}
		if tc.Sets[name] {
			continue
		}
		for _, id := range unionKeys(s.elems[name], after.elems[name]) {
			if s.elems[name][id] != after.elems[name][id] && !tc.Elems[name][id] {
				missed = append(missed, "an element of "+name)
			}
		}
	}
	slices.Sort(missed)
	return strings.Join(slices.Compact(missed), ", ")
}
