package plugin

import (
	"net/netip"

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

type hostPort struct {
	pod netip.Prefix // the pod's address with its pod CIDR's length
	m   ipam.PortMapping
}

func hostPorts(st *ipam.State) []hostPort {
	var out []hostPort
	for _, a := range st.Attachments {
		for _, m := range a.PortMappings {
			for _, ip := range a.IPs {
				if m.HostIP.IsValid() && m.HostIP.Is4() != ip.Addr().Is4() {
					continue
				}
				out = append(out, hostPort{pod: ip, m: m})
			}
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
		hpc := c.AddChain(&nftables.Chain{Name: "hostports", Table: t})
		pre := nft.Chain(c, t, "prerouting", nftables.ChainTypeNAT, nftables.ChainHookPrerouting, nftables.ChainPriorityNATDest)
		out := nft.Chain(c, t, "output", nftables.ChainTypeNAT, nftables.ChainHookOutput, nftables.ChainPriorityNATDest)
		post := nft.Chain(c, t, "postrouting", nftables.ChainTypeNAT, nftables.ChainHookPostrouting, nftables.ChainPriorityNATSource)
		nft.Rule(c, pre, nft.Jump(hpc.Name))
		nft.Rule(c, out, nft.Jump(hpc.Name))
		hairpin := map[netip.Prefix]bool{}
		for _, hp := range hps {
			dst := nft.LocalDst()
			if hp.m.HostIP.IsValid() {
				dst = nft.Addr(hp.m.HostIP, true)
			}
			nft.Rule(c, hpc, nft.SameFamily(hp.pod.Addr()), dst, nft.L4Port(hp.m.Protocol, hp.m.HostPort), nft.DNAT(hp.pod.Addr(), hp.m.ContainerPort))
			if r := hp.pod.Masked(); !hairpin[r] {
				hairpin[r] = true
				nft.Rule(c, post, nft.WasDNATed(), nft.InPrefix(r, false, false), nft.InPrefix(r, true, false), nft.Masquerade())
			}
		}
		nft.Rule(c, post, nft.WasDNATed(), nft.InPrefix(netip.MustParsePrefix("127.0.0.0/8"), false, false), nft.Masquerade())
	})
}

// allowLocalhost lets 127.0.0.1:hostPort reach pods: loopback-sourced
// packets may then be routed out of the bridge (and are masqueraded on the
// way). Only the bridge is opened for that, not every interface.
func allowLocalhost(bridge string) error {
	return link.Sysctl("net/ipv4/conf/"+bridge+"/route_localnet", "1")
}
