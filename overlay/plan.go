package overlay

import (
	"cmp"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/netplane/netplane/nodeview"
)

// Input is everything the plan depends on.
type Input struct {
	Config Config
	Self   string          // this node's name
	Nodes  []nodeview.Node // all nodes, this one included
	// Connected are this node's connected subnets: see ConnectedPrefixes.
	Connected []netip.Prefix
	// Underlays are the interfaces that carry this node's InternalIPs, at
	// most one per family; a family without one gets no tunnel device.
	Underlays []Underlay
}

// Underlay is the interface that carries this node's InternalIP of a family.
type Underlay struct {
	Addr  netip.Addr // the InternalIP
	Index int        // interface index
	Name  string
	MTU   int
}

// Path is how a remote node's pod CIDRs of one family are reached.
type Path string

const (
	Direct Path = "direct" // a route via the node's InternalIP
	VXLAN  Path = "vxlan"  // through the tunnel device
	None   Path = "none"   // not routed; Decision.Reason says why
)

// Decision is the path to one remote node in one family. A node without
// pod CIDRs has one decision of family 0.
type Decision struct {
	Node   string
	Family nodeview.Family
	Path   Path
	Reason string // why the path is None; empty otherwise
	// conflict: None because another node has an overlapping pod CIDR or
	// the same tunnel MAC, so the decision depends on other nodes.
	conflict bool
}

// Device is a tunnel device.
type Device struct {
	Name     string
	Family   nodeview.Family
	VNI      int
	Port     int
	Underlay int        // index of the underlay interface
	Local    netip.Addr // source of the outer packets
	MAC      net.HardwareAddr
	MTU      int
	Addr     netip.Prefix // host address; invalid when this node has no pod CIDR of the family
}

// Route sends a remote pod CIDR to a node: via its InternalIP on the
// underlay (Device empty) or through a tunnel device, via the node's
// tunnel gateway (see Gateway).
type Route struct {
	Dst    netip.Prefix
	Via    netip.Addr
	Device string
	Node   string
}

// Neighbour maps a remote node's tunnel gateway to its tunnel MAC.
type Neighbour struct {
	Device string
	IP     netip.Addr
	MAC    net.HardwareAddr
	Node   string
}

// FDBEntry sends frames for a tunnel MAC to the node that owns it.
type FDBEntry struct {
	Device string
	MAC    net.HardwareAddr
	Dst    netip.Addr
	Node   string
}

// Plan is the desired state. Its slices are sorted, so equal inputs give
// equal plans and dumps.
type Plan struct {
	Devices    []Device
	Routes     []Route
	Neighbours []Neighbour
	FDB        []FDBEntry
	Decisions  []Decision
}

// Unroutable are the decisions whose path is None: nodes or families whose
// pod CIDRs get no route, with the reason.
func (p Plan) Unroutable() []Decision {
	var out []Decision
	for _, d := range p.Decisions {
		if d.Path == None {
			out = append(out, d)
		}
	}
	return out
}

// Count is the number of (node, family) decisions per path.
func (p Plan) Count() map[Path]int {
	out := map[Path]int{Direct: 0, VXLAN: 0, None: 0}
	for _, d := range p.Decisions {
		out[d.Path]++
	}
	return out
}

// Changed are the decisions of cur that are new or differ from prev, and
// the nodes of prev that cur no longer has (as Path None, reason "gone"):
// what a caller logs after each sync.
func Changed(prev, cur []Decision) []Decision {
	type key struct {
		node string
		fam  nodeview.Family
	}
	old := map[key]Decision{}
	for _, d := range prev {
		old[key{d.Node, d.Family}] = d
	}
	var out []Decision
	for _, d := range cur {
		k := key{d.Node, d.Family}
		if o, ok := old[k]; !ok || o != d {
			out = append(out, d)
		}
		delete(old, k)
	}
	for _, d := range prev {
		if _, ok := old[key{d.Node, d.Family}]; ok {
			out = append(out, Decision{Node: d.Node, Family: d.Family, Path: None, Reason: "gone"})
		}
	}
	return out
}

// Desired is the plan for in: the tunnel devices, and for every other node
// the routes, neighbours and FDB entries of the path the mode chooses.
func Desired(in Input) Plan {
	var p Plan
	if in.Config.Off {
		return p
	}
	b := builder{in: in, plan: &p, devices: map[nodeview.Family]*Device{}, macs: map[string]string{},
		claimed: map[netip.Prefix]string{}, within: map[netip.Prefix]string{}}
	b.addDevices()
	nodes := slices.Clone(in.Nodes)
	slices.SortFunc(nodes, func(a, b nodeview.Node) int { return strings.Compare(a.Name, b.Name) })
	for _, n := range nodes {
		if n.Name == in.Self {
			continue
		}
		b.addNode(n)
	}
	p.sort()
	return p
}

type builder struct {
	in      Input
	plan    *Plan
	self    nodeview.Node
	devices map[nodeview.Family]*Device
	claimed map[netip.Prefix]string // pod CIDR → node that has it
	within  map[netip.Prefix]string // every prefix wider than a claimed one → its node
	macs    map[string]string       // tunnel MAC → node that has it
}

// addDevices plans a tunnel device per family this node has an underlay
// for, unless the mode never tunnels, and claims this node's pod CIDRs.
func (b *builder) addDevices() {
	for _, n := range b.in.Nodes {
		if n.Name == b.in.Self {
			b.self = n
		}
	}
	for _, c := range b.self.PodCIDRs {
		b.claim(c, b.self.Name)
	}
	if b.in.Config.Mode == Never {
		return
	}
	for _, u := range b.in.Underlays {
		f := nodeview.FamilyOf(u.Addr)
		if _, dup := b.devices[f]; dup || !u.Addr.IsValid() {
			continue
		}
		d := Device{Name: DeviceName(f), Family: f, VNI: b.in.Config.VNI, Port: b.in.Config.Port,
			Underlay: u.Index, Local: u.Addr.Unmap(), MAC: MAC(u.Addr), MTU: u.MTU - nodeview.VXLANOverhead(f)}
		if a, ok := nodeview.TunnelAddr(b.self.PodCIDRs, f); ok {
			d.Addr = netip.PrefixFrom(a, a.BitLen())
		}
		b.macs[d.MAC.String()] = b.self.Name
		b.plan.Devices = append(b.plan.Devices, d)
		b.devices[f] = &b.plan.Devices[len(b.plan.Devices)-1]
	}
}

func (b *builder) addNode(n nodeview.Node) {
	if len(n.PodCIDRs) == 0 {
		b.decide(n.Name, 0, None, "has no spec.podCIDRs")
		return
	}
	for _, f := range []nodeview.Family{nodeview.IPv4, nodeview.IPv6} {
		var cidrs []netip.Prefix
		for _, c := range n.PodCIDRs {
			if nodeview.FamilyOf(c.Addr()) == f {
				cidrs = append(cidrs, c)
			}
		}
		if len(cidrs) > 0 {
			b.addFamily(n, f, cidrs)
		}
	}
}

// addFamily plans the path to n's pod CIDRs of family f.
func (b *builder) addFamily(n nodeview.Node, f nodeview.Family, cidrs []netip.Prefix) {
	ip, ok := n.IP(f)
	if !ok {
		b.decide(n.Name, f, None, fmt.Sprintf("has %s pod CIDRs but no %s InternalIP", f, f))
		return
	}
	if own, ok := b.self.IP(f); ok && own == ip {
		b.decide(n.Name, f, None, fmt.Sprintf("has this node's InternalIP %s", ip))
		return
	}
	for _, c := range cidrs {
		if other := b.overlapping(c); other != "" {
			b.decide(n.Name, f, None, fmt.Sprintf("pod CIDR %s overlaps one of node %s", c, other))
			b.plan.Decisions[len(b.plan.Decisions)-1].conflict = true
			return
		}
	}
	path, reason := b.choose(f, ip)
	via, clash := ip, false
	if path == VXLAN {
		mac := MAC(ip)
		via = Gateway(ip)
		if other, taken := b.macs[mac.String()]; taken {
			clash = true
			path, reason = None, fmt.Sprintf("tunnel MAC %s of %s is also node %s's", mac, ip, other)
		} else {
			b.macs[mac.String()] = n.Name
			dev := b.devices[f].Name
			b.plan.Neighbours = append(b.plan.Neighbours, Neighbour{Device: dev, IP: via, MAC: mac, Node: n.Name})
			b.plan.FDB = append(b.plan.FDB, FDBEntry{Device: dev, MAC: mac, Dst: ip, Node: n.Name})
		}
	}
	b.decide(n.Name, f, path, reason)
	b.plan.Decisions[len(b.plan.Decisions)-1].conflict = clash
	if path == None {
		return
	}
	for _, c := range cidrs {
		b.claim(c, n.Name)
		r := Route{Dst: c, Via: via, Node: n.Name}
		if path == VXLAN {
			r.Device = b.devices[f].Name
		}
		b.plan.Routes = append(b.plan.Routes, r)
	}
}

// choose is the mode's path to a node at ip.
func (b *builder) choose(f nodeview.Family, ip netip.Addr) (Path, string) {
	connected := slices.ContainsFunc(b.in.Connected, func(p netip.Prefix) bool { return p.Contains(ip) })
	mode := b.in.Config.Mode
	if connected && mode != Always {
		return Direct, ""
	}
	if mode == Never {
		return None, fmt.Sprintf("InternalIP %s is on no connected subnet of this node and the overlay mode is never", ip)
	}
	if b.devices[f] == nil {
		return None, fmt.Sprintf("needs the %s tunnel but this node has no %s InternalIP on a local interface", f, f)
	}
	return VXLAN, ""
}

// claim records that node has pod CIDR c. Two prefixes overlap when one
// holds the other, so recording every wider prefix of c makes the overlap
// check a few map look-ups instead of a scan of all nodes.
func (b *builder) claim(c netip.Prefix, node string) {
	b.claimed[c] = node
	for bits := range c.Bits() {
		if w := netip.PrefixFrom(c.Addr(), bits).Masked(); b.within[w] == "" {
			b.within[w] = node
		}
	}
}

// overlapping is the node that already has a pod CIDR overlapping c.
func (b *builder) overlapping(c netip.Prefix) string {
	if owner, ok := b.within[c]; ok {
		return owner
	}
	for bits := c.Bits(); bits >= 0; bits-- {
		if owner, ok := b.claimed[netip.PrefixFrom(c.Addr(), bits).Masked()]; ok {
			return owner
		}
	}
	return ""
}

func (b *builder) decide(node string, f nodeview.Family, path Path, reason string) {
	b.plan.Decisions = append(b.plan.Decisions, Decision{Node: node, Family: f, Path: path, Reason: reason})
}

func (p *Plan) sort() {
	slices.SortFunc(p.Devices, func(a, b Device) int { return cmp.Compare(a.Family, b.Family) })
	slices.SortFunc(p.Routes, func(a, b Route) int {
		return cmp.Or(a.Dst.Addr().Compare(b.Dst.Addr()), cmp.Compare(a.Dst.Bits(), b.Dst.Bits()))
	})
	slices.SortFunc(p.Neighbours, func(a, b Neighbour) int { return cmp.Or(strings.Compare(a.Device, b.Device), a.IP.Compare(b.IP)) })
	slices.SortFunc(p.FDB, func(a, b FDBEntry) int { return cmp.Or(strings.Compare(a.Device, b.Device), a.Dst.Compare(b.Dst)) })
	slices.SortFunc(p.Decisions, func(a, b Decision) int {
		return cmp.Or(strings.Compare(a.Node, b.Node), cmp.Compare(a.Family, b.Family))
	})
}
