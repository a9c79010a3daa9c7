package plugin

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"

	"github.com/google/nftables"

	"github.com/netplane/netplane/cni/ipam"
	"github.com/netplane/netplane/cni/link"
	"github.com/netplane/netplane/cni/nft"
)

// HostPortTable is the inet table holding every hostPort of the node. It is
// rebuilt from the IPAM store (under its lock) whenever an attachment with
// port mappings comes or goes, so DEL, GC and a crashed plugin can never
// leave a stale rule behind the next change.
const HostPortTable = "netplane-hostports"

// Chains of the table: the base chains jump to hostPortChain, which holds
// one DNAT rule per host port and pod address family.
const (
	hostPortChain = "hostports"
	jumpComment   = "to " + hostPortChain
)

type hostPort struct {
	owner string       // containerID/ifname
	pod   netip.Prefix // the pod's address with its pod CIDR's length
	m     ipam.PortMapping
}

// comment names the DNAT rule of hp, so CHECK can find it:
// "<containerID>/<ifname> tcp *:8080 -> 10.244.1.5:80".
func (hp hostPort) comment() string {
	host := "*"
	if hp.m.HostIP.IsValid() {
		host = hp.m.HostIP.String()
	}
	return fmt.Sprintf("%s %s %s -> %s", hp.owner, hp.m.Protocol,
		net.JoinHostPort(host, strconv.Itoa(int(hp.m.HostPort))), netip.AddrPortFrom(hp.pod.Addr(), hp.m.ContainerPort))
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
			out = append(out, hostPort{owner: a.ContainerID + "/" + a.IfName, pod: ip, m: m})
		}
	}
	return out
}

// programHostPorts writes the table for st:
//
//	prerouting/output (dstnat): traffic to a node address (or the mapping's
//	  hostIP) and the host port → DNAT to pod:containerPort
//	postrouting (srcnat): DNATed traffic from a pod of the node to a pod of
//	  the node (including itself: hairpin), and from the node's 127.0.0.0/8,
//	  is masqueraded. Pods on one bridge would otherwise answer each other
//	  directly over L2, around the node's conntrack, with the wrong source.
func programHostPorts(st *ipam.State) error {
	hps := hostPorts(st)
	if len(hps) == 0 {
		return nft.Replace(HostPortTable, nil)
	}
	return nft.Replace(HostPortTable, func(c *nftables.Conn, t *nftables.Table) {
		hpc := c.AddChain(&nftables.Chain{Name: hostPortChain, Table: t})
		pre := nft.Chain(c, t, "prerouting", nftables.ChainTypeNAT, nftables.ChainHookPrerouting, nftables.ChainPriorityNATDest)
		out := nft.Chain(c, t, "output", nftables.ChainTypeNAT, nftables.ChainHookOutput, nftables.ChainPriorityNATDest)
		post := nft.Chain(c, t, "postrouting", nftables.ChainTypeNAT, nftables.ChainHookPostrouting, nftables.ChainPriorityNATSource)
		nft.CommentedRule(c, pre, jumpComment, nft.Jump(hpc.Name))
		nft.CommentedRule(c, out, jumpComment, nft.Jump(hpc.Name))
		hairpin := map[netip.Prefix]bool{}
		for _, hp := range hps {
			dst := nft.LocalDst()
			if hp.m.HostIP.IsValid() {
				dst = nft.Addr(hp.m.HostIP, true)
			}
			nft.CommentedRule(c, hpc, hp.comment(), nft.SameFamily(hp.pod.Addr()), dst, nft.L4Port(hp.m.Protocol, hp.m.HostPort), nft.DNAT(hp.pod.Addr(), hp.m.ContainerPort))
			if r := hp.pod.Masked(); !hairpin[r] {
				hairpin[r] = true
				nft.Rule(c, post, nft.WasDNATed(), nft.InPrefix(r, false, false), nft.InPrefix(r, true, false), nft.Masquerade())
			}
		}
		nft.Rule(c, post, nft.WasDNATed(), nft.InPrefix(netip.MustParsePrefix("127.0.0.0/8"), false, false), nft.Masquerade())
	})
}

// checkHostPorts verifies that the table holds every DNAT rule of a and
// that both base chains jump to them.
func checkHostPorts(a ipam.Attachment) error {
	if ok, err := nft.TableExists(HostPortTable); err != nil || !ok {
		return hostPortsBroken(fmt.Sprintf("the hostPort table inet %s is missing (%v)", HostPortTable, err))
	}
	for _, base := range []string{"prerouting", "output"} {
		have, err := nft.RuleComments(HostPortTable, base)
		if err != nil {
			return hostPortsBroken(err.Error())
		}
		if !slices.Contains(have, jumpComment) {
			return hostPortsBroken(fmt.Sprintf("chain %s of table inet %s does not jump to %s", base, HostPortTable, hostPortChain))
		}
	}
	have, err := nft.RuleComments(HostPortTable, hostPortChain)
	if err != nil {
		return hostPortsBroken(err.Error())
	}
	for _, hp := range attachmentHostPorts(a) {
		if !slices.Contains(have, hp.comment()) {
			return hostPortsBroken(fmt.Sprintf("the hostPort rule %q is missing from table inet %s", hp.comment(), HostPortTable))
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
