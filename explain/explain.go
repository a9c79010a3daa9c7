package explain

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	netv1 "k8s.io/api/networking/v1"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/netplane/netplane/nodeview"
	"github.com/netplane/netplane/policy"
	"github.com/netplane/netplane/wireguard"
)

// Error is a question that names something that is not there: an unknown
// pod, Service or namespace, a port the Service lacks, an address of
// nothing. Its text is the one line the command prints.
type Error struct{ Msg string }

func (e *Error) Error() string { return e.Msg }

func errorf(format string, args ...any) error { return &Error{Msg: fmt.Sprintf(format, args...)} }

// PortQuery is --port: a number or a name, and a protocol ("" for any).
type PortQuery struct {
	Number   int
	Name     string
	Protocol v1.Protocol
}

// ParsePort reads PORT[/tcp|udp|sctp]; PORT is a number or a name.
func ParsePort(s string) (PortQuery, error) {
	var q PortQuery
	if s == "" {
		return q, nil
	}
	port, proto, hasProto := strings.Cut(s, "/")
	if hasProto {
		switch proto {
		case "tcp", "udp", "sctp":
			q.Protocol = v1.Protocol(strings.ToUpper(proto))
		default:
			return q, errorf("--port=%s: the protocol is tcp, udp or sctp, in lower case", s)
		}
	}
	if n, err := strconv.Atoi(port); err == nil {
		if n < 1 || n > 65535 {
			return q, errorf("--port=%s: %d is not in 1-65535", s, n)
		}
		q.Number = n
	} else if port == "" {
		return q, errorf("--port=%s: no port", s)
	} else {
		q.Name = port
	}
	return q, nil
}

// Input is everything one question needs, read by the shell.
type Input struct {
	// From is the source: a pod, or an address (FromNode set when it is a
	// node's).
	FromPod  *v1.Pod
	FromIP   netip.Addr
	FromNode string
	To       string // the destination as given
	Port     PortQuery

	Resolution *Resolution // when To was a name
	// The destination: a pod, a Service (ToIP its address connected to,
	// zero for its first ClusterIP), or a bare address (ToNode set when it
	// is a node's).
	ToPod     *v1.Pod
	ToService *v1.Service
	ToIP      netip.Addr
	ToNode    string
	Slices    []*discoveryv1.EndpointSlice

	// Pods are the source's, the destination's and the endpoints' pods;
	// Namespaces theirs; Policies every NetworkPolicy of those namespaces.
	Pods       []*v1.Pod
	Namespaces []*v1.Namespace
	Policies   []*netv1.NetworkPolicy
	// ClusterPolicies are every ClusterNetworkPolicy (none without the CRD).
	ClusterPolicies []*cnpv1.ClusterNetworkPolicy
	Nodes           []*v1.Node
	Overlay         Overlay
	// Here is the node explain runs on, "" off any node.
	Here string
}

// flow is the question with its objects reduced.
type flow struct {
	in    *Input
	j     *judge
	nodes []nodeview.Node
	zones map[string]string
	src   end
	podOf map[netip.Addr]*v1.Pod
}

// Explain answers in. An *Error is a question naming something absent.
func Explain(in *Input) (*Explanation, error) {
	j, err := newJudge(in.Pods, in.Namespaces, in.Policies)
	if err != nil {
		return nil, err
	}
	if err := j.addCluster(in.ClusterPolicies, in.Nodes); err != nil {
		return nil, err
	}
	f := &flow{in: in, j: j, zones: map[string]string{}, podOf: map[netip.Addr]*v1.Pod{}}
	for _, n := range in.Nodes {
		f.nodes = append(f.nodes, nodeview.Of(n, nodeview.Keep{Annotations: []string{wireguard.Annotation}}))
		f.zones[n.Name] = n.Labels[v1.LabelTopologyZone]
	}
	for _, p := range in.Pods {
		for _, a := range policy.PodFromAPI(p).IPs {
			if q := f.podOf[a]; q == nil || podActive(p) {
				f.podOf[a] = p
			}
		}
	}
	x := &Explanation{APIVersion: APIVersion, Kind: Kind, To: in.To, Resolution: in.Resolution, Backends: []Backend{}}
	f.src = f.source(&x.From)

	switch {
	case in.ToService != nil:
		err = f.service(x)
	case in.ToPod != nil:
		err = f.pod(x, in.ToPod)
	default:
		err = f.address(x)
	}
	if err != nil {
		return nil, err
	}
	f.verdict(x)
	return x, nil
}

func podActive(p *v1.Pod) bool {
	return p.Status.Phase != v1.PodSucceeded && p.Status.Phase != v1.PodFailed
}

// source fills the source and returns it as policy sees it.
func (f *flow) source(out *Peer) end {
	if p := f.in.FromPod; p != nil {
		rec := policy.PodFromAPI(p)
		e := end{pod: rec, node: p.Spec.NodeName}
		if len(rec.IPs) > 0 {
			e.ip = rec.IPs[0]
			if f.in.ToIP.IsValid() {
				for _, a := range rec.IPs {
					if a.Is4() == f.in.ToIP.Is4() {
						e.ip = a
					}
				}
			}
		}
		if p.Spec.HostNetwork {
			// A hostNetwork pod is its node: its address, no policy.
			e.pod = nil
			*out = Peer{Pod: p.Namespace + "/" + p.Name, IP: e.ip.String(), Node: e.node, What: "hostNetwork pod"}
			return e
		}
		*out = Peer{Pod: p.Namespace + "/" + p.Name, IP: e.ip.String(), Node: e.node}
		return e
	}
	*out = Peer{IP: f.in.FromIP.String(), Node: f.in.FromNode, What: "external"}
	if f.in.FromNode != "" {
		out.What = "node " + f.in.FromNode
	} else if p := f.podOf[f.in.FromIP]; p != nil {
		f.in.FromPod = p
		return f.source(out)
	}
	return end{ip: f.in.FromIP, node: f.in.FromNode}
}

// pod explains a connection to one pod (by name or by its address).
func (f *flow) pod(x *Explanation, p *v1.Pod) error {
	rec := policy.PodFromAPI(p)
	if len(rec.IPs) == 0 {
		return errorf("pod %s/%s has no address yet (phase %s)", p.Namespace, p.Name, p.Status.Phase)
	}
	ip := rec.IPs[0]
	if f.in.ToIP.IsValid() {
		ip = f.in.ToIP
	} else if f.src.ip.IsValid() {
		for _, a := range rec.IPs {
			if a.Is4() == f.src.ip.Is4() {
				ip = a
			}
		}
	}
	port, proto, err := podPort(p, rec, f.in.Port)
	if err != nil {
		return err
	}
	x.Port = &Port{Port: int(port), Name: f.in.Port.Name, Protocol: string(proto)}
	x.Backends = append(x.Backends, f.backend(p, ip, port, proto, f.src))
	return nil
}

// podPort is the port asked of a pod: a number, or a named container port.
func podPort(p *v1.Pod, rec *policy.Pod, q PortQuery) (uint16, v1.Protocol, error) {
	proto := q.Protocol
	if proto == "" {
		proto = v1.ProtocolTCP
	}
	switch {
	case q.Number != 0:
		return uint16(q.Number), proto, nil
	case q.Name != "":
		for _, np := range rec.Ports {
			if np.Name == q.Name && (q.Protocol == "" || np.Protocol == protoNumber(q.Protocol)) {
				return np.Port, protoName(np.Protocol), nil
			}
		}
		return 0, "", errorf("pod %s/%s has no container port named %q", p.Namespace, p.Name, q.Name)
	}
	var ports []v1.ContainerPort
	for _, c := range p.Spec.Containers {
		ports = append(ports, c.Ports...)
	}
	if len(ports) == 1 && (q.Protocol == "" || ports[0].Protocol == q.Protocol) {
		return uint16(ports[0].ContainerPort), cmpProto(ports[0].Protocol), nil
	}
	return 0, "", errorf("pod %s/%s: give --port (it declares %d container ports)", p.Namespace, p.Name, len(ports))
}

func cmpProto(p v1.Protocol) v1.Protocol {
	if p == "" {
		return v1.ProtocolTCP
	}
	return p
}

func protoName(n uint8) v1.Protocol {
	for _, p := range []v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP} {
		if protoNumber(p) == n {
			return p
		}
	}
	return v1.ProtocolTCP
}

// address explains a connection to an address that is no Service's: a
// pod's (by address), a node's, or one outside the cluster.
func (f *flow) address(x *Explanation) error {
	ip := f.in.ToIP
	if p := f.podOf[ip]; p != nil {
		return f.pod(x, p)
	}
	port, proto := uint16(f.in.Port.Number), cmpProto(f.in.Port.Protocol)
	if port == 0 {
		return errorf("%s is no pod or Service: give --port as a number", ip)
	}
	x.Port = &Port{Port: int(port), Protocol: string(proto)}
	dst := end{ip: ip, node: f.in.ToNode}
	d := f.j.decide(f.src, dst, protoNumber(proto), port)
	b := Backend{IP: ip.String(), Port: int(port), Node: f.in.ToNode, Egress: d.egress, Ingress: d.ingress,
		Policies: effectsOrEmpty(d.effects), Path: PathUnknown}
	b.Verdict = verdictOf(d.egressOK && d.ingressOK)
	switch {
	case f.in.ToNode != "" && f.in.ToNode == f.src.node:
		b.Path, b.PathText = PathSameNode, "to its own node "+f.in.ToNode
	case f.in.ToNode != "":
		b.Path, b.PathText = PathDirect, "to node "+f.in.ToNode+"'s address, over the underlay"
	default:
		b.PathText = "outside the cluster: the node's default route, masqueraded to its address"
	}
	if d.mismatch != "" {
		b.Ingress += " [" + d.mismatch + "]"
	}
	x.Backends = append(x.Backends, b)
	return nil
}

// backend judges the connection to one pod: policy at both ends, path.
func (f *flow) backend(p *v1.Pod, ip netip.Addr, port uint16, proto v1.Protocol, src end) Backend {
	rec := policy.PodFromAPI(p)
	dst := end{pod: rec, ip: ip, node: p.Spec.NodeName}
	b := Backend{Pod: p.Namespace + "/" + p.Name, IP: ip.String(), Port: int(port), Node: dst.node}
	if p.Spec.HostNetwork {
		dst.pod = nil // its node's address: no policy
	}
	d := f.j.decide(src, dst, protoNumber(proto), port)
	b.Egress, b.Ingress, b.Policies = d.egress, d.ingress, effectsOrEmpty(d.effects)
	if d.mismatch != "" {
		b.Ingress += " [" + d.mismatch + "]"
	}
	b.Verdict = verdictOf(d.egressOK && d.ingressOK)
	from := src.node
	if src.pod == nil && f.in.FromNode == "" && f.in.Here != "" {
		from = f.in.Here
	}
	switch {
	case src.pod != nil && src.ip == ip:
		b.Path, b.PathText = PathLocal, "the pod itself"
	case from == "":
		b.Path, b.PathText = PathOutside, "from outside the cluster to node "+dst.node+", which forwards it to the pod"
	default:
		ov := f.in.Overlay
		ov.Known = ov.Known && from == f.in.Here // the connected subnets are Here's
		b.Path, b.PathText = path(from, dst.node, f.nodes, nodeview.FamilyOf(ip), ov)
	}
	if b.Path == PathNone {
		b.Verdict = Denied
	}
	if f.in.Overlay.PodMTU > 0 && from == f.in.Here {
		b.MTU = f.in.Overlay.PodMTU
	}
	return b
}

func effectsOrEmpty(e []PolicyEffect) []PolicyEffect {
	if e == nil {
		return []PolicyEffect{}
	}
	return e
}

func verdictOf(ok bool) string {
	if ok {
		return Allowed
	}
	return Denied
}

// verdict sets the overall verdict and its line.
func (f *flow) verdict(x *Explanation) {
	x.Verdict = Denied
	for _, b := range x.Backends {
		if b.Verdict == Allowed {
			x.Verdict = Allowed
		}
	}
	proto := ""
	if x.Port != nil {
		proto = fmt.Sprintf(" %s/%d", x.Port.Protocol, x.Port.Port)
	}
	head := fmt.Sprintf("%s from %s to %s%s", x.Verdict, describe(x.From), x.To, proto)
	switch {
	case x.Service != nil && x.Service.Reject:
		x.Reason = head + ": the Service has no usable endpoint, node " + x.Service.ChosenBy + " rejects the connection"
	case x.Service != nil && x.Service.Drop:
		x.Reason = head + ": " + x.Service.Choice + ", node " + x.Service.ChosenBy + " drops the connection"
	case x.Verdict == Allowed:
		var ok []string
		for _, b := range x.Backends {
			if b.Verdict == Allowed {
				ok = append(ok, nameOf(b)+allowance(b))
			}
		}
		x.Reason = head + ": reaches " + strings.Join(ok, ", ")
	default:
		var why []string
		for _, b := range x.Backends {
			why = append(why, nameOf(b)+": "+denial(b))
		}
		if len(why) == 0 {
			why = []string{"no backend"}
		}
		x.Reason = head + ": " + strings.Join(why, "; ")
	}
}

func nameOf(b Backend) string {
	if b.Pod != "" {
		return b.Pod
	}
	return b.IP
}

// policyWords are the backend's egress and ingress words that start with
// prefix ("allowed", "denied"), each named by its direction.
func policyWords(b Backend, prefix string) []string {
	var parts []string
	for _, d := range [][2]string{{"egress ", b.Egress}, {"ingress ", b.Ingress}} {
		if strings.HasPrefix(d[1], prefix) {
			parts = append(parts, d[0]+d[1])
		}
	}
	return parts
}

// allowance names the rules that admit an allowed backend, if any does.
func allowance(b Backend) string {
	if parts := policyWords(b, "allowed"); len(parts) > 0 {
		return " (" + strings.Join(parts, "; ") + ")"
	}
	return ""
}

// denial is why a backend is denied, in a few words.
func denial(b Backend) string {
	parts := policyWords(b, "denied")
	if b.Path == PathNone {
		parts = append(parts, b.PathText)
	}
	if len(parts) == 0 {
		parts = append(parts, "not chosen by the node's rules")
	}
	return strings.Join(parts, "; ")
}

func describe(p Peer) string {
	if p.Pod != "" {
		return p.Pod
	}
	return p.IP
}
