package explain

import (
	"errors"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	netv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/netplane/netplane/nodeview"
)

// The world of the policy cases: namespaces x and y; x/a on n1, x/b on
// n2 serving http on 8080, y/c on n1.
var (
	nsX  = namespace("x", map[string]string{"ns": "x"})
	nsY  = namespace("y", map[string]string{"ns": "y", "team": "blue"})
	podA = pod("x", "a", "n1", "10.244.1.10", map[string]string{"app": "a"})
	podB = pod("x", "b", "n2", "10.244.2.10", map[string]string{"app": "b"}, v1.ContainerPort{Name: "http", ContainerPort: 8080, Protocol: v1.ProtocolTCP})
	podC = pod("y", "c", "n1", "10.244.1.20", map[string]string{"app": "c"})
)

func world(from, to *v1.Pod, port int, pols ...*netv1.NetworkPolicy) *Input {
	return &Input{FromPod: from, ToPod: to, To: to.Namespace + "/" + to.Name, Port: PortQuery{Number: port},
		Pods: []*v1.Pod{podA, podB, podC}, Namespaces: []*v1.Namespace{nsX, nsY}, Policies: pols, Nodes: testNodes,
		Overlay: Overlay{Settings: nodeview.Settings{Overlay: "always"}}}
}

func effect(ns, name, dir, eff string, rule int) PolicyEffect {
	return PolicyEffect{Namespace: ns, Name: name, Direction: dir, Effect: eff, Rule: rule}
}

func TestPolicy(t *testing.T) {
	denyAll := netpol("x", "deny-all", nil, ingressOnly, nil, nil)
	allowA := netpol("x", "allow-a", map[string]string{"app": "b"}, ingressOnly,
		[]netv1.NetworkPolicyIngressRule{{From: []netv1.NetworkPolicyPeer{fromPods(map[string]string{"app": "a"})}}}, nil)
	allowBlue := netpol("x", "allow-blue", map[string]string{"app": "b"}, ingressOnly,
		[]netv1.NetworkPolicyIngressRule{{From: []netv1.NetworkPolicyPeer{fromNamespaces(map[string]string{"team": "blue"})}}}, nil)
	namedHTTP := netpol("x", "named", map[string]string{"app": "b"}, ingressOnly,
		[]netv1.NetworkPolicyIngressRule{{Ports: []netv1.NetworkPolicyPort{tcp(intstr.FromString("http"))}}}, nil)
	endPort := netpol("x", "range", map[string]string{"app": "b"}, ingressOnly,
		[]netv1.NetworkPolicyIngressRule{{Ports: []netv1.NetworkPolicyPort{tcp(intstr.FromInt32(8000), 8100)}}}, nil)
	block := netpol("x", "block", map[string]string{"app": "b"}, ingressOnly,
		[]netv1.NetworkPolicyIngressRule{{From: []netv1.NetworkPolicyPeer{{IPBlock: &netv1.IPBlock{CIDR: "172.16.0.0/16", Except: []string{"172.16.1.0/24"}}}}}}, nil)
	egressDeny := netpol("x", "no-egress", map[string]string{"app": "a"}, egressOnly, nil, nil)
	egressNamed := netpol("x", "egress-http", map[string]string{"app": "a"}, egressOnly, nil,
		[]netv1.NetworkPolicyEgressRule{{Ports: []netv1.NetworkPolicyPort{tcp(intstr.FromString("http"))}}})
	// Ingress only: its egress rules are ignored, as upstream.
	ingressTyped := netpol("x", "ingress-typed", map[string]string{"app": "a"}, ingressOnly, nil,
		[]netv1.NetworkPolicyEgressRule{{To: []netv1.NetworkPolicyPeer{fromPods(map[string]string{"app": "none"})}}})
	second := netpol("x", "allow-80", map[string]string{"app": "b"}, ingressOnly,
		[]netv1.NetworkPolicyIngressRule{{Ports: []netv1.NetworkPolicyPort{tcp(intstr.FromInt32(80))}}, {From: []netv1.NetworkPolicyPeer{fromPods(map[string]string{"app": "a"})}}}, nil)

	cases := []struct {
		name    string
		in      *Input
		verdict string
		text    string // in the backend's egress or ingress words
		effects []PolicyEffect
	}{
		{"no policy", world(podA, podB, 8080), Allowed, "not isolated", nil},
		{"default deny", world(podA, podB, 8080, denyAll), Denied, "denied: isolated by x/deny-all, no rule allows tcp/8080 from pod x/a",
			[]PolicyEffect{effect("x", "deny-all", DirIngress, Isolates, 0)}},
		{"allowed by pod selector", world(podA, podB, 8080, denyAll, allowA), Allowed, "allowed by x/allow-a (rule 1)",
			[]PolicyEffect{effect("x", "allow-a", DirIngress, Isolates, 0), effect("x", "allow-a", DirIngress, Allows, 1), effect("x", "deny-all", DirIngress, Isolates, 0)}},
		{"pod selector, other pod", world(podC, podB, 8080, allowA), Denied, "isolated by x/allow-a", nil},
		{"allowed by namespace selector", world(podC, podB, 8080, allowBlue), Allowed, "allowed by x/allow-blue (rule 1)", nil},
		{"namespace selector, other namespace", world(podA, podB, 8080, allowBlue), Denied, "isolated by x/allow-blue", nil},
		{"named port", world(podA, podB, 8080, namedHTTP), Allowed, "allowed by x/named (rule 1)", nil},
		{"named port, other port", world(podA, podB, 9090, namedHTTP), Denied, "no rule allows tcp/9090", nil},
		{"endPort inside", world(podA, podB, 8099, endPort), Allowed, "allowed by x/range (rule 1)", nil},
		{"endPort outside", world(podA, podB, 8101, endPort), Denied, "isolated by x/range", nil},
		{"second rule allows", world(podA, podB, 8080, second), Allowed, "allowed by x/allow-80 (rule 2)", nil},
		{"egress denied", world(podA, podB, 8080, egressDeny), Denied, "denied: isolated by x/no-egress, no rule allows tcp/8080 to pod x/b",
			[]PolicyEffect{effect("x", "no-egress", DirEgress, Isolates, 0)}},
		{"egress named port on the destination", world(podA, podB, 8080, egressNamed), Allowed, "allowed by x/egress-http (rule 1)", nil},
		{"egress named port, pod without it", world(podA, podC, 8080, egressNamed), Denied, "isolated by x/egress-http", nil},
		{"policyTypes Ingress ignores egress rules", world(podA, podB, 8080, ingressTyped), Allowed, "not isolated", nil},
	}
	// ipBlock with except, from outside the cluster to x/b.
	for _, c := range []struct {
		src, verdict, text string
	}{{"172.16.2.5", Allowed, "allowed by x/block (rule 1)"}, {"172.16.1.5", Denied, "no rule allows tcp/8080 from 172.16.1.5"}, {"10.0.0.1", Denied, "isolated by x/block"}} {
		in := world(podA, podB, 8080, block)
		in.FromPod, in.FromIP = nil, addr(c.src)
		cases = append(cases, struct {
			name    string
			in      *Input
			verdict string
			text    string
			effects []PolicyEffect
		}{"ipBlock except " + c.src, in, c.verdict, c.text, nil})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			x, err := Explain(c.in)
			if err != nil {
				t.Fatal(err)
			}
			if len(x.Backends) != 1 {
				t.Fatalf("backends: %+v", x.Backends)
			}
			b := x.Backends[0]
			if x.Verdict != c.verdict || b.Verdict != c.verdict {
				t.Errorf("verdict %s (backend %s), want %s: %s", x.Verdict, b.Verdict, c.verdict, x.Reason)
			}
			if !strings.Contains(b.Egress+" | "+b.Ingress, c.text) {
				t.Errorf("egress %q, ingress %q: want %q", b.Egress, b.Ingress, c.text)
			}
			if strings.Contains(b.Ingress, "model") {
				t.Errorf("the model and the reading disagree: %s", b.Ingress)
			}
			if c.effects != nil && !slices.Equal(b.Policies, c.effects) {
				t.Errorf("policies %+v, want %+v", b.Policies, c.effects)
			}
			if c.verdict == Denied && !slices.ContainsFunc(b.Policies, func(e PolicyEffect) bool { return e.Effect == Isolates }) {
				t.Errorf("a denial names no isolating policy: %+v", b.Policies)
			}
			if b.Path != PathVXLAN && b.Path != PathSameNode && b.Path != PathOutside {
				t.Errorf("path %s (%s)", b.Path, b.PathText)
			}
		})
	}
}

// The Service cases: a Service x/s port 80 → 8080 in front of x/b (n2),
// and x/d (n1) when given.
func TestService(t *testing.T) {
	podD := pod("x", "d", "n1", "10.244.1.30", map[string]string{"app": "b"})
	base := func(mod func(*v1.Service), eps ...ep) *Input {
		s := service("x", "s", "10.96.0.10", svcPort("", 80, 8080))
		if mod != nil {
			mod(s)
		}
		return &Input{FromPod: podA, ToService: s, To: "svc/x/s", Slices: []*discoveryv1.EndpointSlice{slice(s, "", 8080, eps...)},
			Pods: []*v1.Pod{podA, podB, podD}, Namespaces: []*v1.Namespace{nsX}, Nodes: testNodes, Overlay: Overlay{Settings: nodeview.Settings{Overlay: "never"}}}
	}
	local := v1.ServiceInternalTrafficPolicyLocal
	onlyPort80 := netpol("x", "only-80", map[string]string{"app": "b"}, ingressOnly,
		[]netv1.NetworkPolicyIngressRule{{Ports: []netv1.NetworkPolicyPort{tcp(intstr.FromInt32(80))}}}, nil)
	only8080 := netpol("x", "only-8080", map[string]string{"app": "b"}, ingressOnly,
		[]netv1.NetworkPolicyIngressRule{{Ports: []netv1.NetworkPolicyPort{tcp(intstr.FromInt32(8080))}}}, nil)
	cases := []struct {
		name    string
		in      *Input
		verdict string
		choice  string
		chosen  []string // backends allowed
		check   func(*testing.T, *Explanation)
	}{
		{"all ready", base(nil, ready(podB), ready(podD)), Allowed, "all 2 endpoints", []string{"x/b", "x/d"}, nil},
		{"affinity", base(func(s *v1.Service) { s.Spec.SessionAffinity = v1.ServiceAffinityClientIP }, ready(podB)), Allowed, "all 1", []string{"x/b"},
			func(t *testing.T, x *Explanation) {
				if x.Service.SessionAffinity != "ClientIP" || x.Service.AffinityTimeout != 10800 {
					t.Errorf("affinity %s %d", x.Service.SessionAffinity, x.Service.AffinityTimeout)
				}
			}},
		{"Local without a local endpoint", base(func(s *v1.Service) { s.Spec.InternalTrafficPolicy = &local }, ready(podB)), Denied,
			"Local traffic policy and no local endpoint on node n1", nil, func(t *testing.T, x *Explanation) {
				if !x.Service.Drop || x.Service.Reject {
					t.Errorf("drop %v reject %v", x.Service.Drop, x.Service.Reject)
				}
				if !strings.Contains(x.Reason, "drops") {
					t.Errorf("reason %q", x.Reason)
				}
			}},
		{"Local with a local endpoint", base(func(s *v1.Service) { s.Spec.InternalTrafficPolicy = &local }, ready(podB), ready(podD)), Allowed,
			"1 of 2 endpoints", []string{"x/d"}, nil},
		{"no endpoints", base(nil), Denied, "no endpoints", nil, func(t *testing.T, x *Explanation) {
			if !x.Service.Reject || !strings.Contains(x.Reason, "rejects") {
				t.Errorf("reject %v: %q", x.Service.Reject, x.Reason)
			}
		}},
		{"terminating fallback", base(nil, ep{p: podB, serving: true, terminating: true}, ep{p: podD, terminating: true}), Allowed,
			"serving terminating ones (1)", []string{"x/b"}, nil},
		{"terminating not used while one is ready", base(nil, ep{p: podB, serving: true, terminating: true}, ready(podD)), Allowed,
			"1 of 2", []string{"x/d"}, nil},
		{"topology: zone hints for the source's zone", func() *Input {
			in := base(nil, ready(podB), ready(podD))
			for i, z := range []string{"b", "a"} {
				in.Slices[0].Endpoints[i].Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: z}}}
			}
			return in
		}(), Allowed, "1 of 2", []string{"x/d"}, nil},
		{"externalTrafficPolicy Local, from outside to a node without a local endpoint", func() *Input {
			in := base(func(s *v1.Service) {
				s.Spec.Type, s.Spec.ExternalTrafficPolicy = v1.ServiceTypeNodePort, v1.ServiceExternalTrafficPolicyLocal
				s.Spec.Ports[0].NodePort = 30080
			}, ready(podB))
			in.FromPod, in.FromIP, in.ToNode, in.ToIP = nil, addr("172.16.0.9"), "n1", addr("192.168.0.1")
			return in
		}(), Denied, "Local traffic policy and no local endpoint on node n1", nil, func(t *testing.T, x *Explanation) {
			if x.Port.Port != 30080 || !x.Service.Drop {
				t.Errorf("port %d, drop %v", x.Port.Port, x.Service.Drop)
			}
		}},
		{"externalTrafficPolicy Cluster, from outside: masqueraded to the node", func() *Input {
			in := base(func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeNodePort
				s.Spec.Ports[0].NodePort = 30080
			}, ready(podB))
			in.FromPod, in.FromIP, in.ToNode, in.ToIP = nil, addr("172.16.0.9"), "n1", addr("192.168.0.1")
			return in
		}(), Allowed, "external traffic of node n1: all 1", []string{"x/b"}, func(t *testing.T, x *Explanation) {
			if !strings.Contains(x.Backends[0].PathText, "masqueraded to node n1") {
				t.Errorf("path %q", x.Backends[0].PathText)
			}
		}},
		{"externalTrafficPolicy Local, from the node itself without a local endpoint: every endpoint, masqueraded", func() *Input {
			in := base(func(s *v1.Service) {
				s.Spec.Type, s.Spec.ExternalTrafficPolicy = v1.ServiceTypeNodePort, v1.ServiceExternalTrafficPolicyLocal
				s.Spec.Ports[0].NodePort = 30080
			}, ready(podB))
			in.FromPod, in.FromIP, in.FromNode, in.ToNode, in.ToIP = nil, addr("192.168.0.1"), "n1", "n1", addr("192.168.0.1")
			return in
		}(), Allowed, "as if hairpinned", []string{"x/b"}, func(t *testing.T, x *Explanation) {
			if !strings.Contains(x.Backends[0].PathText, "masqueraded to node n1") {
				t.Errorf("path %q", x.Backends[0].PathText)
			}
		}},
		{"ClusterIP judged on the backend's port", func() *Input { in := base(nil, ready(podB)); in.Policies = append(in.Policies, only8080); return in }(),
			Allowed, "all 1", []string{"x/b"}, nil},
		{"ClusterIP port is not the backend's", func() *Input { in := base(nil, ready(podB)); in.Policies = append(in.Policies, onlyPort80); return in }(),
			Denied, "all 1", nil, func(t *testing.T, x *Explanation) {
				if !strings.Contains(x.Reason, "isolated by x/only-80, no rule allows tcp/8080") {
					t.Errorf("reason %q", x.Reason)
				}
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			x, err := Explain(c.in)
			if err != nil {
				t.Fatal(err)
			}
			if x.Verdict != c.verdict {
				t.Errorf("verdict %s, want %s: %s", x.Verdict, c.verdict, x.Reason)
			}
			if !strings.Contains(x.Service.Choice, c.choice) {
				t.Errorf("choice %q, want %q", x.Service.Choice, c.choice)
			}
			var allowed []string
			for _, b := range x.Backends {
				if b.Verdict == Allowed {
					allowed = append(allowed, b.Pod)
				}
			}
			slices.Sort(allowed)
			if !slices.Equal(allowed, c.chosen) {
				t.Errorf("allowed backends %v, want %v", allowed, c.chosen)
			}
			if len(x.Backends) != len(x.Service.Endpoints) {
				t.Errorf("%d backends for %d endpoints", len(x.Backends), len(x.Service.Endpoints))
			}
			if c.check != nil {
				c.check(t, x)
			}
		})
	}
}

func TestErrors(t *testing.T) {
	two := service("x", "s", "10.96.0.10", svcPort("http", 80, 8080), svcPort("metrics", 9090, 9090))
	one := service("x", "s", "10.96.0.10", svcPort("", 80, 8080))
	external := service("x", "s", "", svcPort("", 80, 8080))
	external.Spec.Type, external.Spec.ExternalName = v1.ServiceTypeExternalName, "example.com"
	headless := service("x", "s", "None", svcPort("", 80, 8080))
	onSvc := func(s *v1.Service, q PortQuery) *Input {
		return &Input{FromPod: podA, ToService: s, To: "svc/x/s", Port: q, Pods: []*v1.Pod{podA}, Nodes: testNodes}
	}
	cases := []struct {
		name string
		in   *Input
		want string
	}{
		{"port the Service lacks", onSvc(one, PortQuery{Number: 443}), "Service x/s has no port 443 (it has 80/tcp)"},
		{"protocol the Service lacks", onSvc(one, PortQuery{Number: 80, Protocol: v1.ProtocolUDP}), "Service x/s has no port 80/udp"},
		{"named port the Service lacks", onSvc(two, PortQuery{Name: "grpc"}), "Service x/s has no port grpc (it has 80/tcp (http), 9090/tcp (metrics))"},
		{"several ports", onSvc(two, PortQuery{}), "Service x/s has several ports"},
		{"ExternalName", onSvc(external, PortQuery{}), "is an ExternalName for example.com"},
		{"headless", onSvc(headless, PortQuery{}), "is headless"},
		{"pod's named port", &Input{FromPod: podA, ToPod: podB, Port: PortQuery{Name: "grpc"}, Pods: []*v1.Pod{podA, podB}}, `pod x/b has no container port named "grpc"`},
		{"pod without ports", &Input{FromPod: podA, ToPod: podC, Pods: []*v1.Pod{podA, podC}}, "pod y/c: give --port"},
		{"address without port", &Input{FromPod: podA, ToIP: addr("1.1.1.1"), Pods: []*v1.Pod{podA}}, "1.1.1.1 is no pod or Service: give --port"},
		{"pod without address", &Input{FromPod: podA, ToPod: pod("x", "pending", "", "", nil), Port: PortQuery{Number: 80}, Pods: []*v1.Pod{podA}}, "pod x/pending has no address yet"},
		{"policy that does not compile", &Input{FromPod: podA, ToPod: podB, Port: PortQuery{Number: 80},
			Policies: []*netv1.NetworkPolicy{netpol("x", "bad", nil, []netv1.PolicyType{"Sideways"}, nil, nil)}}, "spec.policyTypes"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Explain(c.in)
			var e *Error
			if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("error %v, want one line with %q", err, c.want)
			}
			if c.name != "policy that does not compile" && !errors.As(err, &e) {
				t.Errorf("%v is no *Error", err)
			}
		})
	}
	for _, s := range []string{"80/TCP", "0", "70000", "/tcp", "80/icmp"} {
		if _, err := ParsePort(s); err == nil {
			t.Errorf("--port=%s: no error", s)
		}
	}
	for s, want := range map[string]PortQuery{"80": {Number: 80}, "80/udp": {Number: 80, Protocol: v1.ProtocolUDP}, "http": {Name: "http"}, "dns/sctp": {Name: "dns", Protocol: v1.ProtocolSCTP}} {
		if q, err := ParsePort(s); err != nil || q != want {
			t.Errorf("--port=%s: %+v, %v", s, q, err)
		}
	}
}
