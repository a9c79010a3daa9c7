package nft

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/google/nftables"
)

func familyName(f nftables.TableFamily) string {
	switch f {
	case nftables.TableFamilyIPv4:
		return "ip"
	case nftables.TableFamilyIPv6:
		return "ip6"
	case nftables.TableFamilyINet:
		return "inet"
	case nftables.TableFamilyARP:
		return "arp"
	case nftables.TableFamilyBridge:
		return "bridge"
	case nftables.TableFamilyNetdev:
		return "netdev"
	}
	return fmt.Sprintf("family%d", f)
}

var hookNames = map[nftables.ChainHook]string{
	*nftables.ChainHookPrerouting:  "prerouting",
	*nftables.ChainHookInput:       "input",
	*nftables.ChainHookForward:     "forward",
	*nftables.ChainHookOutput:      "output",
	*nftables.ChainHookPostrouting: "postrouting",
}

// Dump renders the table as `nft` input lines in a stable order (table,
// chains, sets and maps, elements by set, rules in chain order), in the
// manner of knftables' fake, so a failing test reads like a ruleset diff.
func (t *Table) Dump() string {
	fam := familyName(t.Family)
	var b strings.Builder
	fmt.Fprintf(&b, "add table %s %s\n", fam, t.Name)
	for _, name := range sortedKeys(t.Chains) {
		c := t.Chains[name]
		if c.Base != nil {
			fmt.Fprintf(&b, "add chain %s %s %s { type %s hook %s priority %d ; }\n",
				fam, t.Name, name, c.Base.Type, hookNames[c.Base.Hook], c.Base.Priority)
		} else {
			fmt.Fprintf(&b, "add chain %s %s %s\n", fam, t.Name, name)
		}
	}
	for _, name := range sortedKeys(t.Sets) {
		s := t.Sets[name]
		kind, typ := "set", s.Spec.Key.Name
		if s.Spec.IsMap() {
			kind, typ = "map", typ+" : "+s.Spec.Data.Name
		}
		flags := ""
		if s.Spec.Dynamic {
			flags = fmt.Sprintf(" flags dynamic,timeout ; timeout %ds ;", int(s.Spec.Timeout.Seconds()))
		}
		fmt.Fprintf(&b, "add %s %s %s %s { type %s ;%s }\n", kind, fam, t.Name, name, typ, flags)
	}
	for _, name := range sortedKeys(t.Sets) {
		s := t.Sets[name]
		texts := make([]string, 0, s.Len())
		for id := range s.All() {
			texts = append(texts, ElementText(id, s.Spec))
		}
		sort.Strings(texts)
		for _, e := range texts {
			fmt.Fprintf(&b, "add element %s %s %s { %s }\n", fam, t.Name, name, e)
		}
	}
	for _, name := range sortedKeys(t.Chains) {
		for _, r := range t.Chains[name].Rules {
			fmt.Fprintf(&b, "add rule %s %s %s %s\n", fam, t.Name, name, r.Text)
		}
	}
	return b.String()
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
