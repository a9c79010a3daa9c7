package wireguard

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	"go4.org/netipx"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Input is everything the plan depends on.
type Input struct {
	Self      string      // this node's name
	PublicKey wgtypes.Key // this node's own key, which no peer may have
	Underlay  netip.Addr  // this node's InternalIP: peers are reached in its family
	Port      int         // every node's WireGuard port
	Nodes     []Node      // all nodes, this one included
}

// Peer is one other node as a WireGuard peer.
type Peer struct {
	Node       string // empty for a peer read back from a device
	PublicKey  wgtypes.Key
	Endpoint   netip.AddrPort
	AllowedIPs []netip.Prefix // sorted
}

// Reason says why a node with pod CIDRs is not a peer.
type Reason string

const (
	NoKey     Reason = "NoKey"     // no public key annotation yet
	BadKey    Reason = "BadKey"    // the annotation is not a key
	NoAddress Reason = "NoAddress" // no InternalIP of this node's family
	Conflict  Reason = "Conflict"  // shares a key or pod addresses with another node
)

// Rejected is a node that is not a peer; its pod CIDRs are dropped.
type Rejected struct {
	Node   string
	Reason Reason
	Detail string // for a person: what is wrong and what to do
}

// Plan is the desired state. Its slices are sorted, so equal inputs give
// equal plans.
type Plan struct {
	Peers    []Peer     // by node name
	Rejected []Rejected // by node name
	// Drop are the pod CIDRs of the rejected nodes, except where they
	// overlap this node's own: traffic to them must be dropped, never sent
	// in clear.
	Drop []netip.Prefix
}

// Desired is the peer set of in.Self: every other node with pod CIDRs, a
// valid key and an InternalIP of this node's family, allowed its pod CIDRs
// of both families. A node is rejected rather than made a peer when
// WireGuard could not tell it from another (a shared key, overlapping pod
// CIDRs): WireGuard would silently give the addresses to one of them.
func Desired(in Input) Plan {
	var plan Plan
	var mine []netip.Prefix
	cands := map[string]*Peer{}
	for _, n := range in.Nodes {
		if n.Name == in.Self {
			mine = n.PodCIDRs
			continue
		}
		if len(n.PodCIDRs) == 0 {
			continue // nothing to route to it, nothing to drop
		}
		p, rej := candidate(in, n)
		if rej != nil {
			plan.Rejected = append(plan.Rejected, *rej)
			continue
		}
		cands[n.Name] = p
	}
	plan.Rejected = append(plan.Rejected, conflicts(in, mine, cands)...)
	for _, r := range plan.Rejected {
		delete(cands, r.Node)
	}
	for _, p := range cands {
		plan.Peers = append(plan.Peers, *p)
	}
	slices.SortFunc(plan.Peers, func(a, b Peer) int { return cmp.Compare(a.Node, b.Node) })
	slices.SortFunc(plan.Rejected, func(a, b Rejected) int { return cmp.Compare(a.Node, b.Node) })
	plan.Drop = dropped(in.Nodes, plan.Rejected, mine)
	return plan
}

// candidate is n as a peer, or why it cannot be one on its own.
func candidate(in Input, n Node) (*Peer, *Rejected) {
	if n.Key == "" {
		return nil, &Rejected{n.Name, NoKey, fmt.Sprintf("node %s has not published its WireGuard public key (annotation %s); its pod traffic is dropped until it does", n.Name, Annotation)}
	}
	key, err := ParseKey([]byte(n.Key))
	if err == nil && key == (wgtypes.Key{}) {
		err = fmt.Errorf("all zero")
	}
	if err != nil {
		return nil, &Rejected{n.Name, BadKey, fmt.Sprintf("annotation %s of node %s: %v; its pod traffic is dropped: delete the annotation and restart netplane on that node", Annotation, n.Name, err)}
	}
	ip, ok := n.ipLike(in.Underlay)
	if !ok {
		return nil, &Rejected{n.Name, NoAddress, fmt.Sprintf("node %s has no InternalIP of the family of %s to send WireGuard packets to; its pod traffic is dropped", n.Name, in.Underlay)}
	}
	cidrs := slices.Clone(n.PodCIDRs)
	slices.SortFunc(cidrs, comparePrefix)
	return &Peer{Node: n.Name, PublicKey: key, Endpoint: netip.AddrPortFrom(ip, uint16(in.Port)), AllowedIPs: cidrs}, nil
}

// conflicts are the candidates that share a key with another node (this
// one included) or pod addresses with another candidate or this node.
func conflicts(in Input, mine []netip.Prefix, cands map[string]*Peer) []Rejected {
	bad := map[string]string{}
	byKey := map[wgtypes.Key][]string{in.PublicKey: {in.Self}}
	type owned struct {
		p    netip.Prefix
		node string
	}
	var all []owned
	for _, p := range mine {
		all = append(all, owned{p, in.Self})
	}
	for name, c := range cands {
		byKey[c.PublicKey] = append(byKey[c.PublicKey], name)
		for _, p := range c.AllowedIPs {
			all = append(all, owned{p, name})
		}
	}
	for _, names := range byKey {
		if len(names) > 1 {
			slices.Sort(names)
			for _, n := range names {
				bad[n] = fmt.Sprintf("node %s has the same WireGuard public key as %v; its pod traffic is dropped: delete the key file of all but one and restart them", n, names)
			}
		}
	}
	// Prefixes nest or are disjoint, so in order of start address a prefix
	// overlaps an earlier one exactly when it starts before the end of the
	// widest one still open.
	slices.SortFunc(all, func(a, b owned) int { return comparePrefix(a.p, b.p) })
	var open owned
	for _, o := range all {
		if open.p.IsValid() && open.p.Addr().BitLen() == o.p.Addr().BitLen() && o.p.Addr().Compare(netipx.PrefixLastIP(open.p)) <= 0 {
			for _, n := range []string{open.node, o.node} {
				if n != in.Self && n != "" {
					bad[n] = fmt.Sprintf("pod CIDR %s of node %s overlaps %s of node %s; the pod traffic of both is dropped until one changes", o.p, o.node, open.p, open.node)
				}
			}
			continue
		}
		open = o
	}
	var out []Rejected
	for n, why := range bad {
		if _, ok := cands[n]; ok {
			out = append(out, Rejected{n, Conflict, why})
		}
	}
	return out
}

// dropped are the pod CIDRs of the rejected nodes that do not overlap this
// node's own, sorted and without repeats.
func dropped(nodes []Node, rejected []Rejected, mine []netip.Prefix) []netip.Prefix {
	if len(rejected) == 0 {
		return nil
	}
	names := map[string]bool{}
	for _, r := range rejected {
		names[r.Node] = true
	}
	var out []netip.Prefix
	for _, n := range nodes {
		if !names[n.Name] {
			continue
		}
		for _, p := range n.PodCIDRs {
			if !slices.ContainsFunc(mine, p.Overlaps) {
				out = append(out, p)
			}
		}
	}
	slices.SortFunc(out, comparePrefix)
	return slices.Compact(out)
}

// comparePrefix orders by address, then wider first.
func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return cmp.Compare(a.Bits(), b.Bits())
}

// NewlyRejected are the rejections in cur that were not in prev with the
// same reason: each deserves one Warning event on its Node.
func NewlyRejected(prev, cur []Rejected) []Rejected {
	was := map[string]Reason{}
	for _, r := range prev {
		was[r.Node] = r.Reason
	}
	var out []Rejected
	for _, r := range cur {
		if was[r.Node] != r.Reason {
			out = append(out, r)
		}
	}
	return out
}
