package explain

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	netv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/testcluster"
)

// flowCase is one probed flow: explain's verdict must be what the real
// connection does, and a denial must name an isolating policy.
type flowCase struct {
	from, to, port string
	addr           string // where the real connection goes
	want           bool
	isolating      string // NAMESPACE/NAME expected to isolate, when denied
	reason         string // for a denial by the Service: in the verdict line
}

func TestExplainOnNodes(t *testing.T) {
	c := newCluster(t)
	n1, n2 := c.Nodes[0], c.Nodes[1]
	c.addPod("x/a", n1, map[string]string{"app": "a"})
	c.addPod("x/b", n2, map[string]string{"app": "b"})
	c.addPod("y/c", n1, map[string]string{"app": "c"})
	svc := c.addService("x", "s", nil, "x/b")
	vip := svc.Spec.ClusterIP + ":80"
	b := c.pods["x/b"].IP
	local := v1.ServiceInternalTrafficPolicyLocal
	affinity := c.addService("x", "sticky", func(s *v1.Service) { s.Spec.SessionAffinity = v1.ServiceAffinityClientIP }, "x/b")
	localOnly := c.addService("x", "local", func(s *v1.Service) { s.Spec.InternalTrafficPolicy = &local }, "x/b")
	empty := c.addService("x", "empty", nil)
	draining := c.addServiceWith("x", "draining", nil, discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)}, "x/b")

	denyAll := netpol("x", "deny-all", nil, ingressOnly, nil, nil)
	allowY := netpol("x", "allow-y-http", map[string]string{"app": "b"}, ingressOnly,
		[]netv1.NetworkPolicyIngressRule{{From: []netv1.NetworkPolicyPeer{fromNamespaces(map[string]string{"ns": "y"})},
			Ports: []netv1.NetworkPolicyPort{tcp(intstr.FromString("http"))}}}, nil)
	egress := func(except string) *netv1.NetworkPolicy {
		return netpol("y", "egress-range", map[string]string{"app": "c"}, egressOnly, nil,
			[]netv1.NetworkPolicyEgressRule{{To: []netv1.NetworkPolicyPeer{{IPBlock: &netv1.IPBlock{CIDR: "10.244.0.0/16", Except: []string{except}}}},
				Ports: []netv1.NetworkPolicyPort{tcp(intstr.FromInt32(8000), 8100)}}})
	}
	steps := []struct {
		name     string
		policies []*netv1.NetworkPolicy
		flows    []flowCase
	}{
		{"no policy", nil, []flowCase{
			{"x/a", "x/b", "8080/tcp", b + ":8080", true, "", ""},
			{"x/a", "svc/x/s", "", vip, true, "", ""},
			{"x/a", "s", "", vip, true, "", ""},
			{"y/c", "s.x", "80", vip, true, "", ""},
		}},
		{"Services", nil, []flowCase{
			{"x/a", "svc/x/sticky", "", affinity.Spec.ClusterIP + ":80", true, "", ""},
			{"x/a", "svc/x/local", "", localOnly.Spec.ClusterIP + ":80", false, "", "no local endpoint on node node1, node node1 drops"},
			{"y/c", "svc/x/empty", "", empty.Spec.ClusterIP + ":80", false, "", "no usable endpoint, node node1 rejects"},
			{"x/a", "svc/x/draining", "", draining.Spec.ClusterIP + ":80", true, "", ""},
		}},
		{"default deny, namespace selector on a named port", []*netv1.NetworkPolicy{denyAll, allowY}, []flowCase{
			{"x/a", "x/b", "8080/tcp", b + ":8080", false, "x/deny-all", ""},
			{"y/c", "x/b", "8080/tcp", b + ":8080", true, "", ""},
			{"y/c", "x/b", "80/tcp", b + ":80", false, "x/allow-y-http", ""},
			{"y/c", "svc/x/s", "", vip, true, "", ""}, // judged on the backend's 8080
			{"x/a", "svc/x/s", "", vip, false, "x/deny-all", ""},
		}},
		{"egress ipBlock except, endPort", []*netv1.NetworkPolicy{denyAll, allowY, egress(b + "/32")}, []flowCase{
			{"y/c", "x/b", "8080/tcp", b + ":8080", false, "y/egress-range", ""},
			{"y/c", "svc/x/s", "", vip, false, "y/egress-range", ""},
		}},
		{"egress allowed", []*netv1.NetworkPolicy{denyAll, allowY, egress("10.244.3.0/24")}, []flowCase{
			{"y/c", "x/b", "8080/tcp", b + ":8080", true, "", ""},
			{"y/c", "svc/x/s", "80", vip, true, "", ""},
			{"y/c", "x/b", "80/tcp", b + ":80", false, "x/allow-y-http", ""},
		}},
	}
	for _, st := range steps {
		c.setPolicies(st.policies...)
		for _, f := range st.flows {
			name := fmt.Sprintf("%s: %s -> %s %s", st.name, f.from, f.to, f.port)
			framework.Eventually(t, 30*time.Second, name+" connects="+fmt.Sprint(f.want), func() error {
				if got := c.connects(f.from, f.addr); got != f.want {
					return fmt.Errorf("connects %v", got)
				}
				return nil
			})
			args := []string{"--from=" + f.from, "--to=" + f.to}
			if f.port != "" {
				args = append(args, "--port="+f.port)
			}
			x, out, err := c.explain(c.pods[f.from].Node, args...)
			if err != nil {
				t.Fatalf("%s: %v\n%s", name, err, out)
			}
			if (x.Verdict == Allowed) != f.want {
				t.Errorf("%s: explain says %s, the connection %v:\n%s", name, x.Verdict, f.want, out)
			}
			if x.Kernel == nil || !x.Kernel.Agrees {
				t.Errorf("%s: the node's kernel does not agree: %+v", name, x.Kernel)
			}
			if f.want {
				continue
			}
			if f.reason != "" {
				if !strings.Contains(x.Reason, f.reason) {
					t.Errorf("%s: the verdict line does not say %q: %s", name, f.reason, x.Reason)
				}
				// A rejection fails at once (ICMP), a drop times out.
				_, err := c.pods[f.from].NS.Ask("tcp", f.addr, 700*time.Millisecond)
				if refused := err != nil && !strings.Contains(err.Error(), "timeout"); refused != strings.Contains(f.reason, "rejects") {
					t.Errorf("%s: explain says %q, the connection: %v", name, x.Reason, err)
				}
				continue
			}
			if !slices.ContainsFunc(x.Backends, func(b Backend) bool {
				return slices.ContainsFunc(b.Policies, func(p PolicyEffect) bool {
					return p.Effect == Isolates && p.Namespace+"/"+p.Name == f.isolating
				})
			}) || !strings.Contains(x.Reason, f.isolating) {
				t.Errorf("%s: the denial does not name %s: %s", name, f.isolating, x.Reason)
			}
		}
	}

	t.Run("a kernel that differs from the model", func(t *testing.T) {
		c.setPolicies(denyAll)
		framework.Eventually(t, 30*time.Second, "x/a denied", func() error {
			if c.connects("x/a", b+":8080") {
				return fmt.Errorf("connects")
			}
			return nil
		})
		// A map element of the policy table, by hand, on x/b's node.
		n2.NS.MustExec(t, "nft", "delete", "element", "inet", "netplane-policy", "ingress-pods", "{ "+b+" }")
		x, out, err := c.explain(n2, "--from=x/a", "--to=x/b", "--port=8080")
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if x.Kernel == nil || x.Kernel.Agrees || !slices.ContainsFunc(x.Kernel.Differences, func(d string) bool {
			return strings.Contains(d, "ingress-pods: lacks "+b+" : jump ingress-")
		}) {
			t.Errorf("the deleted element is not reported: %+v", x.Kernel)
		}
		// An element of the Service's dispatch map on x/a's node.
		n1.NS.MustExec(t, "nft", "delete", "element", "ip", "netplane", "service-ips", "{ "+svc.Spec.ClusterIP+" . tcp . 80 }")
		x, out, err = c.explain(n1, "--from=x/a", "--to=svc/x/s")
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if x.Kernel == nil || x.Kernel.Agrees || !slices.ContainsFunc(x.Kernel.Differences, func(d string) bool {
			return strings.Contains(d, "service-ips: lacks 1 of the 1 elements of Service x/s")
		}) {
			t.Errorf("the deleted Service element is not reported: %+v", x.Kernel)
		}
		// Fresh agents program their tables whole: the kernels agree again.
		for _, n := range []*testcluster.Node{n1, n2} {
			c.Stop(n)
			c.Start(t, n, agentFlags...)
		}
		for _, q := range []struct {
			n    *testcluster.Node
			args []string
		}{{n2, []string{"--from=x/a", "--to=x/b", "--port=8080"}}, {n1, []string{"--from=x/a", "--to=svc/x/s"}}} {
			framework.Eventually(t, 60*time.Second, "the kernel of "+q.n.Name+" agrees", func() error {
				x, out, err := c.explain(q.n, q.args...)
				switch {
				case err != nil:
					return fmt.Errorf("%v: %s", err, out)
				case x.Kernel == nil || !x.Kernel.Agrees:
					return fmt.Errorf("%+v", x.Kernel)
				}
				return nil
			})
		}
	})

	t.Run("errors", func(t *testing.T) {
		for _, e := range []struct {
			args []string
			want string
		}{
			{[]string{"--from=x/nope", "--to=x/b"}, "pod x/nope not found"},
			{[]string{"--from=nons/a", "--to=x/b"}, "namespace nons not found"},
			{[]string{"--from=x/a", "--to=svc/x/nope"}, "Service x/nope not found"},
			{[]string{"--from=x/a", "--to=svc/x/s", "--port=443"}, "Service x/s has no port 443 (it has 80/tcp)"},
			{[]string{"--from=x/a", "--to=10.244.2.250", "--port=80"}, "address 10.244.2.250 belongs to no pod"},
			{[]string{"--from=x/a", "--to=nope.x"}, "name nope.x does not resolve in the cluster"},
		} {
			out, err := n1.NS.Exec(c.bin, append([]string{"explain", "--kubeconfig=" + n1.Kubeconfig}, e.args...)...)
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if err == nil || !strings.Contains(err.Error(), "exit status 1") || len(lines) != 1 || !strings.Contains(out, e.want) {
				t.Errorf("%v: %v, %q; want exit 1 and one line with %q", e.args, err, out, e.want)
			}
		}
	})
}
