package policy

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/netplane/netplane/nodeview"
)

// What a first packet evaluates in the tiers: each distinct match of a
// tier once, in the tier's own chain.

// tierChain is x/a's chain of a tier in direction d: its verdict map
// element's for Admin, its next map element's for Baseline.
func tierChain(t *testing.T, m *Model, d Direction) *Chain {
	t.Helper()
	a := netip.MustParseAddr("10.0.1.1")
	c := m.Table().Chains[m.vmap[d][a]]
	if c == nil || !strings.HasPrefix(c.Name, "admin-") {
		t.Fatalf("x/a's %s element: chain %v, want its Admin chain", d, c)
	}
	return c
}

// tieredModel is the e2e model with no policy, on both families.
func tieredModel() *tiered {
	c := newTiered([]string{"n1", "n2"})
	for _, ns := range modelNamespaces {
		c.setNamespace(modelNamespace(ns))
		for _, name := range modelPods {
			c.setPod(modelPod(ns, name))
		}
	}
	return c
}

func TestATierChainHoldsEachMatchOnceWithItsFirstVerdict(t *testing.T) {
	c := tieredModel()
	metadata := networks("169.254.169.254/32")
	first := to(admin("first", 10, inNamespace("x")), actDeny, cnpPeers(metadata))
	to(first, actAccept, cnpPeers(nsPeerOf("y")), tcpPort(80))
	second := to(admin("second", 20, inNamespace("x")), actAccept, cnpPeers(metadata))
	to(second, actAccept, cnpPeers(nsPeerOf("y")), tcpPort(80))
	to(second, actDeny, cnpPeers(nsPeerOf("z")))
	c.setCNP(t, first)
	c.setCNP(t, second)
	m := c.models["n1"]
	var metadataRules, yRules, zRules []Rule
	for _, r := range tierChain(t, m, Egress).Rules {
		if r.Family != nodeview.IPv4 {
			continue
		}
		switch set := m.Table().Sets[r.Set]; {
		case set != nil && set.Kind == RangeSet:
			metadataRules = append(metadataRules, r)
		case strings.HasPrefix(r.Set, "sel-") && r.Proto == 6:
			yRules = append(yRules, r)
		case strings.HasPrefix(r.Set, "sel-"):
			zRules = append(zRules, r)
		}
	}
	if len(metadataRules) != 1 || !strings.HasPrefix(metadataRules[0].Verdict.Chain, "deny-egress-") {
		t.Errorf("the metadata address, denied by the first policy and accepted by the second: rules %v, want the first's deny only", metadataRules)
	}
	if len(yRules) != 1 || len(zRules) != 1 {
		t.Errorf("y on TCP 80 in both policies, z in the second: rules %v and %v, want one of each", yRules, zRules)
	}
	// The trace and the table still agree that the first policy decides.
	d := m.Trace(Flow{Dir: Egress, Pod: podKey("x", "a"), Peer: netip.MustParseAddr("169.254.169.254"), Proto: 6, Port: 80})
	if d.Allowed || d.Admin.Policy != "first" {
		t.Errorf("x/a to the metadata address: %+v, want denied by first", d)
	}
}

func TestAClusterNamedPortIsOneLookupWhateverTheProtocol(t *testing.T) {
	c := tieredModel()
	p := to(admin("named", 10, inNamespace("x")), actDeny, cnpPeers(nsPeerOf("y")), namedPortOf("serve-81-udp"))
	from(p, actDeny, cnpPeers(nsPeerOf("y")), namedPortOf("serve-81-udp"))
	c.setCNP(t, p)
	m := c.models["n1"]
	for _, d := range directions {
		var lookups []Rule
		for _, r := range tierChain(t, m, d).Rules {
			if r.PortSet != "" {
				lookups = append(lookups, r)
			}
		}
		if len(lookups) != 2 || lookups[0].Proto != 0 || lookups[1].Proto != 0 {
			t.Errorf("%s: named port rules %v, want one per family, of no protocol", d, lookups)
		}
	}
	for _, probe := range []struct {
		proto uint8
		port  uint16
		deny  bool
	}{{17, 81, true}, {6, 81, false}, {132, 81, false}, {17, 80, false}, {1, 0, false}} {
		pkt := Packet{Hook: "forward", Src: netip.MustParseAddr("10.0.1.1"), Dst: netip.MustParseAddr("10.0.2.2"), Proto: probe.proto, Port: probe.port}
		if tr := m.Table().Trace(pkt); tr.Accepted == probe.deny {
			t.Errorf("x/a to y/b on %d/%d: accepted %v, want %v; %v", probe.proto, probe.port, tr.Accepted, !probe.deny, tr.Steps)
		}
	}
}
