package explain

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"go4.org/netipx"
	"golang.org/x/sys/unix"

	"github.com/netplane/netplane/nft"
	"github.com/netplane/netplane/nodeview"
	"github.com/netplane/netplane/overlay"
	"github.com/netplane/netplane/policy"
	"github.com/netplane/netplane/proxy"
	"github.com/netplane/netplane/wireguard"
)

// Kernel is the kernel of the network namespace explain runs in, read
// only: nftables tables through the driver, addresses, routes, FDB and
// conntrack through netlink.
type Kernel interface {
	Table(id nft.TableID) (*nft.Table, error) // nil, nil: no such table
	Addrs() ([]netip.Addr, error)
	Routes() ([]netlink.Route, error)
	TunnelRoutes() ([]netlink.Route, error) // WireGuard's table (wireguard.RouteTable)
	LinkName(index int) string
	Underlays(self nodeview.Node) ([]overlay.Underlay, error)
	nodeview.Underlay // the interfaces of the node's addresses, for its MTU
	FDB(device string) ([]netlink.Neigh, error)
	Conntrack(fam nodeview.Family) ([]*netlink.ConntrackFlow, error)
}

// Locate finds the node whose kernel k is: a node role's table is there
// and one of the node's InternalIPs is a local address. It fills in.Here
// and the overlay facts only that node knows.
func Locate(k Kernel, in *Input) error {
	pt, err := k.Table(policy.TableID)
	if err != nil {
		return nil // no nftables access: not on a node
	}
	st, _ := k.Table(nft.TableID{Family: unix.NFPROTO_IPV4, Name: proxy.TableName})
	if pt == nil && st == nil {
		return nil
	}
	addrs, err := k.Addrs()
	if err != nil {
		return err
	}
	for _, n := range in.Nodes {
		v := nodeview.Of(n, nodeview.Keep{})
		if !slices.ContainsFunc(v.IPs, func(a netip.Addr) bool { return slices.Contains(addrs, a) }) {
			continue
		}
		in.Here = n.Name
		routes, err := k.Routes()
		if err != nil {
			return err
		}
		skip := map[int]bool{}
		for _, r := range routes {
			if strings.HasPrefix(k.LinkName(r.LinkIndex), "netplane.vxlan") {
				skip[r.LinkIndex] = true
			}
		}
		in.Overlay.Known = true
		in.Overlay.Connected = overlay.ConnectedPrefixes(routes, skip)
		if in.Overlay.Underlays, err = k.Underlays(v); err != nil {
			return err
		}
		if mtu, err := nodeview.UnderlayMTU(k, v); err == nil {
			in.Overlay.PodMTU = in.Overlay.Settings.PodMTU(mtu, v)
		}
		return nil
	}
	return nil
}

// Check compares what the node's kernel holds for the flow with the
// model: the policy table's elements for the flow's addresses, the proxy's
// elements and chains of the Service, the route and FDB entry to each
// backend's node; and lists the flow's conntrack entries.
func Check(k Kernel, in *Input, x *Explanation) (*KernelReport, error) {
	if in.Here == "" {
		return nil, nil
	}
	out := &KernelReport{Node: in.Here, Differences: []string{}}
	addrs := map[netip.Addr]bool{}
	if a, err := netip.ParseAddr(x.From.IP); err == nil {
		addrs[a] = true
	}
	for _, b := range x.Backends {
		if a, err := netip.ParseAddr(b.IP); err == nil && b.Path != PathNone {
			addrs[a] = true
		}
	}
	j, err := newJudge(in.Pods, in.Namespaces, in.Policies)
	if err != nil {
		return nil, err
	}
	if err := j.addCluster(in.ClusterPolicies, in.Nodes); err != nil {
		return nil, err
	}
	if err := checkPolicy(k, j.model(in.Here).Table(), addrs, out); err != nil {
		return nil, err
	}
	if in.ToService != nil {
		zone := ""
		for _, n := range in.Nodes {
			if n.Name == in.Here {
				zone = n.Labels["topology.kubernetes.io/zone"]
			}
		}
		if err := checkService(k, proxy.ServiceTables(in.ToService, in.Slices, proxy.NodeFacts{Name: in.Here, Zone: zone}), in.ToService.Namespace+"/"+in.ToService.Name, out); err != nil {
			return nil, err
		}
	}
	if err := checkPaths(k, in, x, out); err != nil {
		return nil, err
	}
	out.Agrees = len(out.Differences) == 0
	out.Conntrack, err = conntrack(k, x, addrs)
	return out, err
}

// checkPolicy: every element of the model's sets and maps about the flow's
// addresses is in the kernel's table, and no other element about them is
// in its verdict maps or address sets.
func checkPolicy(k Kernel, want *policy.Table, addrs map[netip.Addr]bool, out *KernelReport) error {
	have, err := k.Table(policy.TableID)
	if err != nil {
		return fmt.Errorf("reading table inet %s: %w", policy.TableName, err)
	}
	if have == nil {
		out.Differences = append(out.Differences, "table inet "+policy.TableName+" is missing")
		return nil
	}
	// The chains a verdict or next map element may jump to: group chains
	// and the pods' Admin and Baseline chains.
	var groups []string
	for name := range have.Chains {
		for _, prefix := range []string{"ingress-", "egress-", "admin-", "baseline-"} {
			if strings.HasPrefix(name, prefix) {
				groups = append(groups, name)
				break
			}
		}
	}
	slices.Sort(groups)
	for _, name := range slices.Sorted(maps.Keys(want.Sets)) {
		s := want.Sets[name]
		if s.Kind == policy.RangeSet {
			continue
		}
		hs := have.Sets[name]
		for a := range addrs {
			if nodeview.FamilyOf(a) != s.Family {
				continue
			}
			// The elements about a the model wants or the kernel may hold.
			var cands []policy.Element
			switch s.Kind {
			case policy.AddrVerdictMap:
				for _, g := range groups {
					cands = append(cands, policy.Element{Addr: a, Chain: g})
				}
			case policy.AddrSet:
				cands = append(cands, policy.Element{Addr: a})
			}
			for e := range s.All() {
				if e.Addr == a {
					if s.Kind == policy.AddrVerdictMap && !slices.Contains(cands, e) {
						cands = append(cands, e)
					}
					if s.Kind == policy.AddrProtoPortSet {
						cands = append(cands, e)
					}
				}
			}
			for _, e := range cands {
				id := policy.ElementID(s, e)
				if s.Has(e) {
					out.Checked = append(out.Checked, fmt.Sprintf("inet %s %s: %s", policy.TableName, name, s.ElementText(e)))
					if hs == nil || hs.Value(id) == 0 {
						out.Differences = append(out.Differences, fmt.Sprintf("table inet %s, %s: lacks %s", policy.TableName, name, s.ElementText(e)))
					}
					if s.Kind == policy.AddrVerdictMap && have.Chains[e.Chain] == nil {
						out.Differences = append(out.Differences, fmt.Sprintf("table inet %s: chain %s is missing", policy.TableName, e.Chain))
					}
				} else if hs != nil && hs.Value(id) > 0 {
					out.Differences = append(out.Differences, fmt.Sprintf("table inet %s, %s: holds %s, which the model does not", policy.TableName, name, s.ElementText(e)))
				}
			}
		}
	}
	return nil
}

// checkService: every element the proxy's rules for the Service add, and
// every chain they use, is in the node's tables.
func checkService(k Kernel, want map[nodeview.Family]*nft.Table, svc string, out *KernelReport) error {
	for _, f := range nodeview.Families {
		t := want[f]
		if t == nil {
			continue
		}
		have, err := k.Table(t.ID())
		if err != nil {
			return fmt.Errorf("reading table %s: %w", t.ID(), err)
		}
		if have == nil {
			out.Differences = append(out.Differences, "table "+t.ID().String()+" is missing")
			continue
		}
		n := 0
		for _, name := range slices.Sorted(maps.Keys(t.Chains)) {
			n++
			if have.Chains[name] == nil {
				out.Differences = append(out.Differences, fmt.Sprintf("table %s: chain %s is missing", t.ID(), name))
			}
		}
		out.Checked = append(out.Checked, fmt.Sprintf("%s: %d chains", t.ID(), n))
		for _, name := range slices.Sorted(maps.Keys(t.Sets)) {
			s, hs := t.Sets[name], have.Sets[name]
			if s.Spec.Dynamic {
				continue // affinity sets: the kernel's own
			}
			missing := 0
			for id := range s.All() {
				if hs == nil || hs.Value(id) == 0 {
					missing++
				}
			}
			if s.Len() > 0 {
				out.Checked = append(out.Checked, fmt.Sprintf("%s %s: %d elements of Service %s", t.ID(), name, s.Len(), svc))
			}
			if missing > 0 {
				out.Differences = append(out.Differences, fmt.Sprintf("table %s, %s: lacks %d of the %d elements of Service %s", t.ID(), name, missing, s.Len(), svc))
			}
		}
	}
	return nil
}

// checkPaths: the route (and for VXLAN the FDB entry) the overlay's plan
// has for each backend's node.
func checkPaths(k Kernel, in *Input, x *Explanation, out *KernelReport) error {
	var nodes []nodeview.Node
	for _, n := range in.Nodes {
		nodes = append(nodes, nodeview.Of(n, nodeview.Keep{}))
	}
	plan := overlay.Desired(overlay.Input{Config: overlay.Config{Mode: overlay.Mode(in.Overlay.Settings.Overlay)}.Defaults(), Self: in.Here,
		Nodes: nodes, Connected: in.Overlay.Connected, Underlays: in.Overlay.Underlays})
	routes, err := k.Routes()
	if err != nil {
		return err
	}
	done := map[string]bool{}
	for _, b := range x.Backends {
		if b.Path == PathWireGuard && !done[b.Node] && b.Node != in.Here {
			done[b.Node] = true
			if err := checkTunnel(k, b, nodes, out); err != nil {
				return err
			}
			continue
		}
		if (b.Path != PathDirect && b.Path != PathVXLAN) || done[b.Node] || b.Node == in.Here {
			continue
		}
		done[b.Node] = true
		for _, r := range plan.Routes {
			if r.Node != b.Node {
				continue
			}
			out.Checked = append(out.Checked, fmt.Sprintf("route %s via %s", r.Dst, r.Via))
			if !slices.ContainsFunc(routes, func(kr netlink.Route) bool {
				d, ok := netipx.FromStdIPNet(kr.Dst)
				gw, _ := netip.AddrFromSlice(kr.Gw)
				return ok && d.Masked() == r.Dst && gw.Unmap() == r.Via
			}) {
				out.Differences = append(out.Differences, fmt.Sprintf("route %s via %s (to node %s) is missing", r.Dst, r.Via, r.Node))
			}
		}
		for _, e := range plan.FDB {
			if e.Node != b.Node {
				continue
			}
			out.Checked = append(out.Checked, fmt.Sprintf("fdb %s dst %s dev %s", e.MAC, e.Dst, e.Device))
			fdb, err := k.FDB(e.Device)
			if err != nil {
				return err
			}
			if !slices.ContainsFunc(fdb, func(n netlink.Neigh) bool {
				d, _ := netip.AddrFromSlice(n.IP)
				return n.HardwareAddr.String() == e.MAC.String() && d.Unmap() == e.Dst
			}) {
				out.Differences = append(out.Differences, fmt.Sprintf("FDB entry %s dst %s on %s (to node %s) is missing", e.MAC, e.Dst, e.Device, e.Node))
			}
		}
	}
	return nil
}

// checkTunnel: the routes of the backend's node's pod CIDRs of its
// family into the WireGuard device, in WireGuard's table. The peer itself
// lives in the device, which the userspace implementation keeps in the
// agent's process, out of reach.
func checkTunnel(k Kernel, b Backend, nodes []nodeview.Node, out *KernelReport) error {
	ip, err := netip.ParseAddr(b.IP)
	if err != nil {
		return nil
	}
	routes, err := k.TunnelRoutes()
	if err != nil {
		return err
	}
	for _, n := range nodes {
		if n.Name != b.Node {
			continue
		}
		for _, cidr := range n.PodCIDRs {
			if nodeview.FamilyOf(cidr.Addr()) != nodeview.FamilyOf(ip) {
				continue
			}
			out.Checked = append(out.Checked, fmt.Sprintf("route %s dev %s table %d", cidr, wireguard.DeviceName, wireguard.RouteTable))
			if !slices.ContainsFunc(routes, func(kr netlink.Route) bool {
				d, ok := netipx.FromStdIPNet(kr.Dst)
				return ok && d.Masked() == cidr && k.LinkName(kr.LinkIndex) == wireguard.DeviceName
			}) {
				out.Differences = append(out.Differences, fmt.Sprintf("route %s dev %s in table %d (to node %s) is missing", cidr, wireguard.DeviceName, wireguard.RouteTable, b.Node))
			}
		}
	}
	return nil
}

// conntrack lists the entries of flows from the source to the
// destination's addresses.
func conntrack(k Kernel, x *Explanation, addrs map[netip.Addr]bool) ([]string, error) {
	src, err := netip.ParseAddr(x.From.IP)
	if err != nil {
		return nil, nil
	}
	dsts := map[netip.Addr]bool{}
	for a := range addrs {
		dsts[a] = true
	}
	if x.Service != nil {
		if a, err := netip.ParseAddr(x.Service.Address); err == nil {
			dsts[a] = true
		}
	}
	flows, err := k.Conntrack(nodeview.FamilyOf(src))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, f := range flows {
		s, _ := netip.AddrFromSlice(f.Forward.SrcIP)
		d, _ := netip.AddrFromSlice(f.Forward.DstIP)
		if s.Unmap() != src || !dsts[d.Unmap()] {
			continue
		}
		rs, _ := netip.AddrFromSlice(f.Reverse.SrcIP)
		out = append(out, fmt.Sprintf("%s %s:%d -> %s:%d, replies from %s:%d, %ds left",
			protoText(f.Forward.Protocol), s.Unmap(), f.Forward.SrcPort, d.Unmap(), f.Forward.DstPort, rs.Unmap(), f.Reverse.SrcPort, f.TimeOut))
	}
	slices.Sort(out)
	return out, nil
}

func protoText(p uint8) string { return nft.ProtoName(p) }
