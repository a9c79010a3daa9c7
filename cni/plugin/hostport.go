package plugin

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/netplane/netplane/cni/conflist"
	"github.com/netplane/netplane/cni/ipam"
	"github.com/netplane/netplane/link"
	"github.com/netplane/netplane/nft"
)

// HostPortTable is the inet table holding every hostPort of the node. It is
// rebuilt from the IPAM store (under its lock) whenever an attachment with
// port mappings comes or goes, so DEL, GC and a crashed plugin can never
// leave a stale rule behind the next change. It is small (a rule per host
// port), so it is rewritten whole in one transaction (nft.Replace), which
// also heals any edit made by someone else.
var HostPortTable = nft.TableID{Family: nftables.TableFamilyINet, Name: conflist.HostPortTable}

// hostPortChain holds one DNAT rule per host port and pod address family;
// the base chains jump to it.
const hostPortChain = "hostports"

var (
	dstNAT = &nft.Hook{Type: nftables.ChainTypeNAT, Hook: *nftables.ChainHookPrerouting, Priority: int32(*nftables.ChainPriorityNATDest)}
	outNAT = &nft.Hook{Type: nftables.ChainTypeNAT, Hook: *nftables.ChainHookOutput, Priority: int32(*nftables.ChainPriorityNATDest)}
	srcNAT = &nft.Hook{Type: nftables.ChainTypeNAT, Hook: *nftables.ChainHookPostrouting, Priority: int32(*nftables.ChainPriorityNATSource)}
	// jump is the rule of both dstnat chains.
	jump = nft.NewRule(nftables.TableFamilyINet).Jump(hostPortChain).Rule()
)

type hostPort struct {
	pod netip.Prefix // the pod's address with its pod CIDR's length
	m   ipam.PortMapping
}

// rule is hp's DNAT rule: traffic to a node address (or the mapping's
// hostIP) and the host port goes to pod:containerPort.
func (hp hostPort) rule() nft.Rule {
	r := nft.NewRule(nftables.TableFamilyINet).NFProto(hp.pod.Addr().Is6())
	if hp.m.HostIP.IsValid() {
		r.MatchPrefix(nft.Daddr, netip.PrefixFrom(hp.m.HostIP, hp.m.HostIP.BitLen()), false)
	} else {
		r.FibLocal(nft.Daddr)
	}
	proto := uint8(unix.IPPROTO_TCP)
	if hp.m.Protocol == "udp" {
		proto = unix.IPPROTO_UDP
	}
	return r.L4Proto(proto).MatchPort(nft.THDport, hp.m.HostPort).DNATTo(netip.AddrPortFrom(hp.pod.Addr(), hp.m.ContainerPort)).Rule()
}

func hostPorts(st *ipam.State) []hostPort {
	var out []hostPort
	for _, a := range st.Attachments {
		out = append(out, attachmentHostPorts(a)...)
	}
	return out
}

// attachmentHostPorts are a's mappings, one per pod address of the mapping's
// family (both, without a hostIP).
func attachmentHostPorts(a ipam.Attachment) []hostPort {
	var out []hostPort
	for _, m := range a.PortMappings {
		for _, ip := range a.IPs {
			if m.HostIP.IsValid() && m.HostIP.Is4() != ip.Addr().Is4() {
				continue
			}
			out = append(out, hostPort{pod: ip, m: m})
		}
	}
	return out
}

// hostPortTable is the table of hps, nil without any:
//
//	prerouting/output (dstnat): jump to hostports, the DNAT rules
//	postrouting (srcnat): DNATed traffic from a pod of the node to a pod of
//	  the node (including itself: hairpin), and from the node's 127.0.0.0/8,
//	  is masqueraded. Pods on one bridge would otherwise answer each other
//	  directly over L2, around the node's conntrack, with the wrong source.
func hostPortTable(hps []hostPort) *nft.Table {
	if len(hps) == 0 {
		return nil
	}
	t := nft.NewTable(HostPortTable.Family, HostPortTable.Name)
	t.Chain(hostPortChain, nil)
	t.Chain("prerouting", dstNAT)
	t.Chain("output", outNAT)
	t.Chain("postrouting", srcNAT)
	t.AddRule("prerouting", jump)
	t.AddRule("output", jump)
	hairpin := map[netip.Prefix]bool{}
	for _, hp := range hps {
		t.AddRule(hostPortChain, hp.rule())
		if r := hp.pod.Masked(); !hairpin[r] {
			hairpin[r] = true
			t.AddRule("postrouting", nft.NewRule(t.Family).NFProto(r.Addr().Is6()).CtStatusDNAT().
				MatchPrefix(nft.Saddr, r, false).MatchPrefix(nft.Daddr, r, false).Masquerade(false).Rule())
		}
	}
	t.AddRule("postrouting", nft.NewRule(t.Family).NFProto(false).CtStatusDNAT().
		MatchPrefix(nft.Saddr, netip.MustParsePrefix("127.0.0.0/8"), false).Masquerade(false).Rule())
	return t
}

// programHostPorts writes the table for st in one transaction, or deletes
// it when no attachment has host ports.
func programHostPorts(st *ipam.State) error {
	t := hostPortTable(hostPorts(st))
	if t == nil {
		return nft.Delete(nft.Dialer{}, HostPortTable)
	}
	return nft.Replace(nft.Dialer{}, t)
}

// checkHostPorts verifies that the table holds every DNAT rule of a and
// that both base chains jump to them. It reads the rules' fingerprints
// only, and changes nothing.
func checkHostPorts(a ipam.Attachment) error {
	have, err := nft.RuleFingerprints(nft.Dialer{}, HostPortTable, "prerouting", "output", hostPortChain)
	if errors.Is(err, fs.ErrNotExist) {
		return hostPortsBroken(fmt.Sprintf("the hostPort table %s is incomplete (%v)", HostPortTable, err))
	}
	if err != nil {
		return hostPortsBroken(err.Error())
	}
	for _, base := range []string{"prerouting", "output"} {
		if !slices.Contains(have[base], jump.FP) {
			return hostPortsBroken(fmt.Sprintf("chain %s of table %s does not jump to %s", base, HostPortTable, hostPortChain))
		}
	}
	for _, hp := range attachmentHostPorts(a) {
		if r := hp.rule(); !slices.Contains(have[hostPortChain], r.FP) {
			return hostPortsBroken(fmt.Sprintf("the hostPort rule %q is missing from table %s", r.Text, HostPortTable))
		}
	}
	return nil
}

func hostPortsBroken(what string) error {
	return fmt.Errorf("%s: the next ADD or DEL of a pod with host ports on this node rewrites the table; or DEL and ADD this pod", what)
}

// allowLocalhost lets 127.0.0.1:hostPort reach pods: loopback-sourced
// packets may then be routed out of the bridge (and are masqueraded on the
// way). Only the bridge is opened for that, not every interface.
func allowLocalhost(bridge string) error {
	return link.Sysctl("net/ipv4/conf/"+bridge+"/route_localnet", "1")
}
