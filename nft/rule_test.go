package nft

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// TestStatementsReadBackAsTheyAreWritten programs one rule per statement
// and finds in `nft list` what the kernel made of its expressions: the
// statement's own text, or where nft prints it otherwise, that. It is long
// because of the table of statements, one row each, per family.
func TestStatementsReadBackAsTheyAreWritten(t *testing.T) {
	ns, dial := kernelNS(t)
	for _, fam := range []nftables.TableFamily{nftables.TableFamilyIPv4, nftables.TableFamilyIPv6, nftables.TableFamilyINet} {
		v6 := fam == nftables.TableFamilyIPv6
		addr := func(v4, v6addr string) string {
			if v6 {
				return v6addr
			}
			return v4
		}
		pfx := func(v4, v6p string) netip.Prefix { return netip.MustParsePrefix(addr(v4, v6p)) }
		word := map[nftables.TableFamily]string{nftables.TableFamilyIPv4: "ip", nftables.TableFamilyIPv6: "ip6", nftables.TableFamilyINet: "ip"}[fam]
		start := func() *RuleBuilder {
			r := NewRule(fam)
			if fam == nftables.TableFamilyINet {
				r.NFProto(false)
			}
			return r
		}
		addrType := nftables.TypeIPAddr
		if v6 {
			addrType = nftables.TypeIP6Addr
		}
		want := NewTable(fam, testName)
		want.Set("addrs", SetSpec{Key: addrType})
		want.Set("pairs", SetSpec{Key: nftables.MustConcatSetType(addrType, addrType)})
		want.Set("ports", SetSpec{Key: nftables.MustConcatSetType(nftables.TypeInetProto, nftables.TypeInetService), Data: nftables.TypeVerdict})
		want.Set("clients", SetSpec{Key: addrType, Dynamic: true, Timeout: time.Minute})
		want.Chain("target", nil)
		want.Chain("other", nil)
		cases := []struct {
			rule *RuleBuilder
			nft  string // what `nft list` prints; the rule's text if empty
		}{
			{start().MatchPrefix(Saddr, pfx("10.0.0.0/8", "fd00::/8"), false).Accept(), ""},
			{start().MatchPrefix(Daddr, pfx("10.0.0.1/32", "fd00::1/128"), true).Drop(), ""},
			{start().MatchPrefixes(Saddr, []netip.Prefix{pfx("10.0.0.0/9", "fd00::/9"), pfx("10.128.0.0/9", "fd80::/9"), pfx("192.168.0.0/16", "fe80::/10")}, true).Return(),
				word + " saddr != { " + addr("10.0.0.0/8, 192.168.0.0/16", "fd00::/8, fe80::/10") + " } return"},
			{start().Lookup("addrs", Daddr).Jump("target"), ""},
			{start().Lookup("pairs", Saddr, Daddr).Goto("target"), ""},
			{start().Vmap("ports", L4Proto, THDport), ""},
			{start().CtState(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED).Accept(), ""},
			{start().L4Proto(unix.IPPROTO_UDP).Counter().Accept(), "meta l4proto udp counter packets 0 bytes 0 accept"},
			{start().FibLocal(Daddr).Accept(), "fib daddr type local accept"},
			{start().MarkHas(0x4000).MarkClear(0x4000).Accept(), "meta mark & 0x00004000 != 0x00000000 meta mark set meta mark & 0xffffbfff accept"},
			{start().MarkSet(0x4000).Log("np: ").Accept(), `meta mark set meta mark | 0x00004000 log prefix "np: " accept`},
			{start().Limit(10, expr.LimitTimeSecond, 20).Accept(), ""},
			{start().PickOneOf(3).Goto("target"), "numgen random mod 3 0 goto target"},
			// nft reads the keys, numgen's numbers in host order, as
			// big-endian integers.
			{start().NumgenVmap([]string{"target", "other"}), "numgen random mod 2 vmap { 0 : goto target, 16777216 : goto other }"},
			{start().Update("clients", Saddr, time.Minute).Accept(), "update @clients { " + word + " saddr timeout 1m } accept"},
			{start().L4Proto(unix.IPPROTO_TCP).Reject(), ""},
			// nft folds the protocol match into the port's.
			{start().L4Proto(unix.IPPROTO_UDP).MatchPort(THDport, 8080).Accept(), "udp dport 8080 accept"},
			{start().CtStatusDNAT().Accept(), ""},
		}
		for _, c := range cases {
			want.AddRule("target", c.rule.Rule())
		}
		// A nat chain for the address translations.
		want.Chain("nat", &Hook{Type: nftables.ChainTypeNAT, Hook: *nftables.ChainHookPrerouting, Priority: -100})
		natRules := []struct {
			rule *RuleBuilder
			nft  string
		}{
			{start().L4Proto(unix.IPPROTO_TCP).DNATTo(netip.AddrPortFrom(netip.MustParseAddr(addr("10.0.0.7", "fd00::7")), 8080)), ""},
			{start().Masquerade(true), ""},
			{start().Oifname("eth9").SNATTo(netip.MustParseAddr(addr("10.0.0.9", "fd00::9")), true), ""},
		}
		if fam != nftables.TableFamilyINet {
			// Within its own family's table nft leaves the family out.
			natRules[0].nft = "meta l4proto tcp dnat to " + addr("10.0.0.7:8080", "[fd00::7]:8080")
			natRules[2].nft = `oifname "eth9" snat to ` + addr("10.0.0.9", "fd00::9") + " fully-random"
		}
		want.AddRule("nat", natRules[0].rule.Rule())
		want.Chain("masq", &Hook{Type: nftables.ChainTypeNAT, Hook: *nftables.ChainHookPostrouting, Priority: 100})
		want.AddRule("masq", natRules[1].rule.Rule())
		want.AddRule("masq", natRules[2].rule.Rule())
		p := NewProgrammer(dial, want.ID())
		defer p.Close()
		if _, err := p.Sync(want, true); err != nil {
			t.Fatalf("%s: %v", want.ID(), err)
		}
		out := ns.MustExec(t, "nft", "list", "table", familyName(fam), testName)
		failed := false
		for i, c := range append(cases, natRules...) {
			text := c.nft
			if text == "" {
				text = c.rule.Rule().Text
			}
			// In an inet table nft shows the family match only where no
			// address statement implies it.
			const nfproto = "meta nfproto ipv4 "
			if !slices.ContainsFunc([]string{text, nfproto + text, strings.TrimPrefix(text, nfproto)}, func(text string) bool {
				return strings.Contains(out, "\t\t"+text+" comment")
			}) {
				t.Errorf("%s: rule %d %q reads back otherwise", want.ID(), i, text)
				failed = true
			}
		}
		if failed {
			t.Logf("nft list table %s:\n%s", want.ID(), out)
		}
	}
}
