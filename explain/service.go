package explain

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/netplane/netplane/nodeview"
	"github.com/netplane/netplane/proxy"
)

// service explains a connection to a Service: its port, the endpoints the
// source's node's rules choose (proxy.Choose, the code that builds those
// rules), then each endpoint as a backend.
func (f *flow) service(x *Explanation) error {
	svc := f.in.ToService
	name := svc.Namespace + "/" + svc.Name
	switch {
	case svc.Spec.Type == v1.ServiceTypeExternalName:
		return errorf("Service %s is an ExternalName for %s: netplane's DNS answers a CNAME, no node proxies it", name, svc.Spec.ExternalName)
	case svc.Spec.ClusterIP == v1.ClusterIPNone:
		return errorf("Service %s is headless: connect to a pod (its name resolves to the pods' addresses)", name)
	}
	node := f.src.node
	if f.src.pod == nil && f.in.ToNode != "" {
		node = f.in.ToNode // an outside client: the node it connects to
	} else if f.src.pod == nil && node == "" {
		node = f.in.Here
	}
	choices := proxy.Choose(svc, f.in.Slices, node, f.zones[node])
	c, err := pickPort(svc, choices, f.in.Port, f.in.ToNode != "")
	if err != nil {
		return err
	}
	addr, kind := f.serviceAddr(c)
	proto := c.Protocol
	x.Port = &Port{Port: int(c.Port), Name: c.Name, Protocol: string(proto)}
	if kind == "nodeport" {
		x.Port.Port = int(c.NodePort)
	}
	s := &Service{Namespace: svc.Namespace, Name: svc.Name, Type: string(svc.Spec.Type), Address: addr.String(),
		Port: int(c.Port), PortName: c.Name, NodePort: int(c.NodePort), SessionAffinity: string(v1.ServiceAffinityNone),
		InternalTrafficPolicy: "Cluster", ChosenBy: node, Endpoints: []Endpoint{}}
	if s.Type == "" {
		s.Type = string(v1.ServiceTypeClusterIP)
	}
	if c.Affinity > 0 {
		s.SessionAffinity, s.AffinityTimeout = string(v1.ServiceAffinityClientIP), int(c.Affinity.Seconds())
	}
	if c.InternalLocal {
		s.InternalTrafficPolicy = "Local"
	}
	if p := svc.Spec.ExternalTrafficPolicy; p != "" && (c.NodePort != 0 || len(c.ExternalIPs) > 0) {
		s.ExternalTrafficPolicy = string(p)
	}
	x.Service = s

	// Which endpoints the node sends this traffic to.
	chosen, how := c.Internal, "ClusterIP traffic"
	masquerade := false
	if kind != "cluster" {
		how = "external traffic"
		local := f.src.pod == nil && f.src.node != "" && f.src.node == node // the node's own address
		chosen, masquerade = c.ExternalFor(f.src.pod != nil, local)
		// A pod's masqueraded source is judged as the pod's still: its
		// egress is, and which node address it gets depends on the route.
		masquerade = masquerade && f.src.pod == nil
		if c.ExternalLocal && (f.src.pod != nil || local) {
			how = "external traffic of the node or its pods (Local policy: as if hairpinned)"
		}
	}
	s.Choice = describeChoice(c, chosen, how, node)
	if len(chosen) == 0 {
		s.Reject, s.Drop = !c.Any, c.Any
	}
	byAddr := f.sliceEndpoints(c)
	for _, e := range c.Endpoints {
		ep := byAddr[e.Addr]
		ep.IP, ep.Port = e.Addr.Addr().String(), int(e.Addr.Port())
		ep.Ready, ep.Serving, ep.Terminating = e.Ready, e.Serving, e.Terminating
		ep.Chosen = slices.Contains(chosen, e.Addr)
		s.Endpoints = append(s.Endpoints, ep)
		f.endpointBackend(x, ep, proto, masquerade, c.Affinity > 0)
	}
	return nil
}

// endpointBackend adds the backend of one endpoint: judged when chosen.
func (f *flow) endpointBackend(x *Explanation, ep Endpoint, proto v1.Protocol, masquerade, affinity bool) {
	ip := netip.MustParseAddr(ep.IP)
	p := f.podOf[ip]
	if !ep.Chosen {
		b := Backend{Pod: ep.Pod, IP: ep.IP, Port: ep.Port, Node: ep.Node, Verdict: Denied, Path: PathNone,
			PathText: "not chosen by node " + x.Service.ChosenBy + "'s rules (" + condition(ep) + ")", Policies: []PolicyEffect{}}
		x.Backends = append(x.Backends, b)
		return
	}
	src := f.src
	if masquerade && f.in.ToNode != "" {
		// Cluster policy: the node masquerades to its own address.
		src = end{ip: f.nodeIP(f.in.ToNode, ip), node: f.in.ToNode}
	}
	var b Backend
	if p == nil {
		b = Backend{IP: ep.IP, Port: ep.Port, Node: ep.Node, Path: PathUnknown, PathText: "an address of no pod"}
		d := f.j.decide(src, end{ip: ip, node: ep.Node}, protoNumber(proto), uint16(ep.Port))
		b.Egress, b.Ingress, b.Policies = d.egress, d.ingress, effectsOrEmpty(d.effects)
		b.Verdict = verdictOf(d.egressOK && d.ingressOK)
	} else {
		b = f.backend(p, ip, uint16(ep.Port), proto, src)
	}
	if masquerade {
		b.PathText += "; the source is masqueraded to node " + f.in.ToNode + "'s address"
	}
	if affinity {
		b.PathText += "; ClientIP affinity keeps a client on the backend it first got"
	}
	x.Backends = append(x.Backends, b)
}

func condition(ep Endpoint) string {
	switch {
	case ep.Ready:
		return "ready, but not for this node"
	case ep.Serving && ep.Terminating:
		return "terminating, and ready endpoints exist"
	case ep.Terminating:
		return "terminating, not serving"
	}
	return "not ready"
}

func (f *flow) nodeIP(name string, like netip.Addr) netip.Addr {
	for _, n := range f.nodes {
		if n.Name == name {
			if a, ok := n.IP(familyOf(like)); ok {
				return a
			}
		}
	}
	return netip.Addr{}
}

// serviceAddr is the address connected to and its kind: cluster (a
// ClusterIP), external (externalIPs, load balancer) or nodeport.
func (f *flow) serviceAddr(c proxy.PortChoice) (netip.Addr, string) {
	ip := f.in.ToIP
	switch {
	case f.in.ToNode != "":
		return ip, "nodeport"
	case ip.IsValid() && slices.Contains(c.ExternalIPs, ip):
		return ip, "external"
	case ip.IsValid():
		return ip, "cluster"
	}
	for _, a := range c.ClusterIPs {
		if !f.src.ip.IsValid() || a.Is4() == f.src.ip.Is4() {
			return a, "cluster"
		}
	}
	if len(c.ClusterIPs) > 0 {
		return c.ClusterIPs[0], "cluster"
	}
	return netip.Addr{}, "cluster"
}

// pickPort is the Service port asked about: --port by number (the node
// port when connecting to a node), by name, or the only port.
func pickPort(svc *v1.Service, cs []proxy.PortChoice, q PortQuery, nodePort bool) (proxy.PortChoice, error) {
	name := svc.Namespace + "/" + svc.Name
	var have []string
	var match []proxy.PortChoice
	for _, c := range cs {
		num := c.Port
		if nodePort {
			num = c.NodePort
		}
		have = append(have, fmt.Sprintf("%d/%s", num, strings.ToLower(string(c.Protocol))))
		if c.Name != "" {
			have[len(have)-1] += " (" + c.Name + ")"
		}
		if q.Protocol != "" && c.Protocol != q.Protocol {
			continue
		}
		if (q.Number != 0 && int(num) == q.Number) || (q.Name != "" && c.Name == q.Name) || (q.Number == 0 && q.Name == "") {
			match = append(match, c)
		}
	}
	asked := q.Name
	if q.Number != 0 {
		asked = fmt.Sprint(q.Number)
	}
	if q.Protocol != "" {
		asked += "/" + strings.ToLower(string(q.Protocol))
	}
	switch {
	case len(cs) == 0:
		return proxy.PortChoice{}, errorf("Service %s has no port a node proxies", name)
	case len(match) == 1:
		return match[0], nil
	case len(match) == 0 && nodePort:
		return proxy.PortChoice{}, errorf("Service %s has no node port %s (it has %s)", name, asked, strings.Join(have, ", "))
	case len(match) == 0:
		return proxy.PortChoice{}, errorf("Service %s has no port %s (it has %s)", name, asked, strings.Join(have, ", "))
	}
	return proxy.PortChoice{}, errorf("Service %s has several ports (%s): give --port", name, strings.Join(have, ", "))
}

// describeChoice says how the node chose, in words.
func describeChoice(c proxy.PortChoice, chosen []netip.AddrPort, how, node string) string {
	n := "node " + node
	if node == "" {
		n = "a node"
	}
	switch {
	case len(c.Endpoints) == 0:
		return "no endpoints"
	case !c.Any:
		return "no endpoint is ready or serving"
	case len(chosen) == 0:
		return fmt.Sprintf("Local traffic policy and no local endpoint on %s", n)
	case c.Fallback:
		return fmt.Sprintf("%s of %s: no endpoint is ready, so the serving terminating ones (%d)", how, n, len(chosen))
	case len(chosen) < len(c.Endpoints):
		return fmt.Sprintf("%s of %s: %d of %d endpoints (local, topology or readiness)", how, n, len(chosen), len(c.Endpoints))
	}
	return fmt.Sprintf("%s of %s: all %d endpoints", how, n, len(chosen))
}

// sliceEndpoints are the slices' facts of each endpoint address (pod,
// node, zone, slice name), first slice by name first.
func (f *flow) sliceEndpoints(c proxy.PortChoice) map[netip.AddrPort]Endpoint {
	out := map[netip.AddrPort]Endpoint{}
	sl := slices.Clone(f.in.Slices)
	slices.SortFunc(sl, func(a, b *discoverySlice) int { return strings.Compare(a.Name, b.Name) })
	for _, s := range sl {
		var num int32
		for _, p := range s.Ports {
			pn, pp := "", v1.ProtocolTCP
			if p.Name != nil {
				pn = *p.Name
			}
			if p.Protocol != nil {
				pp = *p.Protocol
			}
			if pn == c.Name && pp == c.Protocol && p.Port != nil {
				num = *p.Port
			}
		}
		for _, e := range s.Endpoints {
			if len(e.Addresses) == 0 {
				continue
			}
			a, err := netip.ParseAddr(e.Addresses[0])
			if err != nil {
				continue
			}
			k := netip.AddrPortFrom(a.Unmap(), uint16(num))
			if _, ok := out[k]; ok {
				continue
			}
			ep := Endpoint{Slice: s.Name}
			if e.NodeName != nil {
				ep.Node = *e.NodeName
			}
			if e.Zone != nil {
				ep.Zone = *e.Zone
			}
			if r := e.TargetRef; r != nil && r.Kind == "Pod" {
				ep.Pod = r.Namespace + "/" + r.Name
			} else if p := f.podOf[a.Unmap()]; p != nil {
				ep.Pod = p.Namespace + "/" + p.Name
			}
			out[k] = ep
		}
	}
	return out
}

type discoverySlice = discoveryv1.EndpointSlice

func familyOf(a netip.Addr) nodeview.Family { return nodeview.FamilyOf(a) }
