package wireguard

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

func describeRoutes(rs []Route) string {
	var out []string
	for _, r := range rs {
		switch {
		case r.Throw:
			out = append(out, "throw "+r.Dst.String())
		case r.Src.IsValid():
			out = append(out, fmt.Sprintf("%s src %s", r.Dst, r.Src))
		default:
			out = append(out, r.Dst.String())
		}
	}
	return strings.Join(out, "; ")
}

func TestRoutesIntoTheDevice(t *testing.T) {
	plan := Plan{
		Peers: []Peer{{Node: "b", AllowedIPs: prefixes("10.244.2.0/24", "fd00:10:244:2::/64")}},
		Drop:  prefixes("10.244.3.0/24"),
	}
	mine := prefixes("10.244.1.0/24", "fd00:10:244:1::/64")
	own := DeviceAddrs(mine)
	cluster := prefixes("10.244.0.0/16", "fd00:10:244::/48")
	cases := []struct {
		name   string
		strict bool
		want   string
	}{
		{"strict: peers, the rejected node and the cluster's pod CIDRs into the device; this node's own to the bridge", true,
			"10.244.0.0/16 src 10.244.1.0; throw 10.244.1.0/24; 10.244.2.0/24 src 10.244.1.0; 10.244.3.0/24 src 10.244.1.0; " +
				"fd00:10:244::/48 src fd00:10:244:1::; throw fd00:10:244:1::/64; fd00:10:244:2::/64 src fd00:10:244:1::"},
		{"permissive: only the peers; the rest follows the overlay's routes", false,
			"throw 10.244.1.0/24; 10.244.2.0/24 src 10.244.1.0; throw fd00:10:244:1::/64; fd00:10:244:2::/64 src fd00:10:244:1::"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := describeRoutes(Routes(plan, cluster, mine, own, c.strict)); got != c.want {
				t.Errorf("routes:\n%s\nwant:\n%s", got, c.want)
			}
		})
	}
}

func TestGuardDropsOnlyWhatWouldLeaveInClear(t *testing.T) {
	cases := []struct {
		name        string
		drop        []netip.Prefix
		want, wantN []string // rule texts of the clear and no-key chains
	}{
		{"every node a peer", nil,
			[]string{`oifname "netplane.wg" return`, `oifname "cni0" return`, `oifname "lo" return`,
				"meta nfproto ipv4 ip daddr 10.244.0.0/16 counter drop", "meta nfproto ipv6 ip6 daddr fd00:10:244::/48 counter drop"}, nil},
		{"a node without a key", prefixes("10.244.3.0/24", "fd00:10:244:3::/64"), nil,
			[]string{"meta nfproto ipv4 ip daddr 10.244.3.0/24 counter drop", "meta nfproto ipv6 ip6 daddr fd00:10:244:3::/64 counter drop"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := Guard(c.drop, prefixes("10.244.0.0/16", "fd00:10:244::/48"), "cni0")
			texts := func(chain string) []string {
				var out []string
				for _, r := range g.Chains[chain].Rules {
					out = append(out, r.Text)
				}
				return out
			}
			if c.want != nil && fmt.Sprint(texts(ChainClear)) != fmt.Sprint(c.want) {
				t.Errorf("clear chain %q, want %q", texts(ChainClear), c.want)
			}
			if fmt.Sprint(texts(ChainNoKey)) != fmt.Sprint(c.wantN) {
				t.Errorf("no-key chain %q, want %q", texts(ChainNoKey), c.wantN)
			}
		})
	}
}
