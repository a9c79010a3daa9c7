package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"regexp"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
)

// TestFlowsThroughTheNodeRole runs `netplane --role=node` in a node
// namespace against a real API server and checks the packet-flow table:
// {source, protocol, destination, port} → {backends | refused | dropped,
// client address seen}. A row with backends also fails when, once every
// backend has answered, another one does (see lab.confirm). It is long
// because of that table, whose rows share one node and its Services.
func TestFlowsThroughTheNodeRole(t *testing.T) {
	l := newLab(t)
	web := l.service("web", []labEP{{pod: "a1"}, {pod: "b1"}})
	empty := l.service("empty", nil)
	self := l.service("self", []labEP{{pod: "a1"}})
	np := l.service("np", []labEP{{pod: "a1"}, {pod: "b1"}}, func(s *v1.Service) { s.Spec.Type = v1.ServiceTypeNodePort })
	etpLocal := func(s *v1.Service) { s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal }
	loc := l.service("local", []labEP{{pod: "a1"}, {pod: "b1"}}, loadBalancer("198.51.100.4"), etpLocal)
	remoteOnly := l.service("remote-only", []labEP{{pod: "b1"}}, loadBalancer("198.51.100.5"), etpLocal)
	itp := l.service("itp", []labEP{{pod: "a1"}, {pod: "b1"}}, func(s *v1.Service) {
		s.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyLocal)
	})
	itpRemote := l.service("itp-remote", []labEP{{pod: "b1"}}, func(s *v1.Service) {
		s.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyLocal)
	})
	l.service("lb-proxy-mode", []labEP{{pod: "a1"}}, loadBalancer("198.51.100.7"), func(s *v1.Service) {
		s.Status.LoadBalancer.Ingress[0].IPMode = ptr.To(v1.LoadBalancerIPModeProxy)
	})
	sticky := l.service("sticky", []labEP{{pod: "a1"}, {pod: "a2"}, {pod: "b1"}}, func(s *v1.Service) {
		s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
	})
	term := l.service("term", []labEP{{pod: "a2", terminating: true}})
	lbOpen := l.service("lb-open", []labEP{{pod: "a1"}}, loadBalancer("198.51.100.1"))
	l.service("lb-closed", []labEP{{pod: "a1"}}, loadBalancer("198.51.100.2", "192.0.2.0/24"))
	l.service("lb-allowed", []labEP{{pod: "a1"}}, loadBalancer("198.51.100.3", "203.0.113.0/25"))
	l.service("lb6", []labEP{{pod: "a1"}}, loadBalancer("198.51.100.6", "2001:db8:5100::6"))
	l.service("extip", []labEP{{pod: "a1"}}, func(s *v1.Service) {
		s.Spec.ExternalIPs = []string{"192.168.0.2", "fd00:192::2"}
		s.Spec.Ports = s.Spec.Ports[:1]
		s.Spec.Ports[0].Port = 8888
	})
	// Topology hints, as the EndpointSlice controller writes them; node1 is in zone z1.
	zonal := l.service("zonal", []labEP{{pod: "a1", zones: []string{"z1"}}, {pod: "b1", zones: []string{"z2"}}})
	nodal := l.service("nodal", []labEP{{pod: "a2", zones: []string{"z1"}, nodes: []string{nodeA}}, {pod: "b1", zones: []string{"z1"}, nodes: []string{nodeB}}})
	elsewhere := l.service("elsewhere", []labEP{{pod: "a1", zones: []string{"z2"}}, {pod: "b1", zones: []string{"z3"}}})
	sctp := l.service("sctp", []labEP{{pod: "a1"}, {pod: "b1"}}, func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeNodePort
		s.Spec.Ports = []v1.ServicePort{{Name: "sctp", Protocol: v1.ProtocolSCTP, Port: 9, TargetPort: intstr.FromInt32(sctpPort)}}
	})
	cip := func(s *v1.Service) string { return s.Spec.ClusterIPs[0] }
	cip6 := func(s *v1.Service) string { return s.Spec.ClusterIPs[len(s.Spec.ClusterIPs)-1] }
	nodePort := func(s *v1.Service) int32 { return s.Spec.Ports[0].NodePort }

	flows := []struct {
		name, from, network, to, seenAs string
		want                            []string
	}{
		{"ClusterIP from a pod reaches every endpoint, unmasqueraded", "a2", "tcp", hp(cip(web), 80), "10.244.1.3", []string{"a1", "b1"}},
		{"ClusterIP over UDP", "a2", "udp", hp(cip(web), 53), "10.244.1.3", []string{"a1", "b1"}},
		{"IPv6 ClusterIP", "a2", "tcp", hp(cip6(web), 80), "fd00:244:1::3", []string{"a1", "b1"}},
		{"ClusterIP from the node itself is masqueraded", "node", "tcp", hp(cip(web), 80), "masq", []string{"a1", "b1"}},
		{"ClusterIP from a pod in a second cluster CIDR of the family is not masqueraded", "b1", "tcp", hp(cip(self), 80), "10.244.2.2", []string{"a1"}},
		{"unknown port on a ClusterIP is rejected", "a2", "tcp", hp(cip(web), 81), "", []string{"refused"}},
		{"unknown port on an IPv6 ClusterIP is rejected", "a2", "tcp", hp(cip6(web), 81), "", []string{"refused"}},
		{"unallocated ClusterIP is dropped, not routed off the node", "a2", "tcp", hp(unallocatedClusterIP4, 80), "", []string{"timeout"}},
		{"unallocated IPv6 ClusterIP is dropped, not routed off the node", "a2", "tcp", hp(unallocatedClusterIP6, 80), "", []string{"timeout"}},
		{"SCTP ClusterIP reaches every endpoint, unmasqueraded", "a2", "sctp", hp(cip(sctp), 9), "10.244.1.3", []string{"a1", "b1"}},
		{"SCTP IPv6 ClusterIP", "a2", "sctp", hp(cip6(sctp), 9), "fd00:244:1::3", []string{"a1", "b1"}},
		{"SCTP NodePort from outside is masqueraded", "ext", "sctp", hp("192.168.0.2", nodePort(sctp)), "masq", []string{"a1", "b1"}},
		{"Service without endpoints is rejected", "a2", "tcp", hp(cip(empty), 80), "", []string{"refused"}},
		{"Service without endpoints is rejected over UDP too", "a2", "udp", hp(cip(empty), 53), "", []string{"refused"}},
		{"hairpin: a pod reaching itself is masqueraded", "a1", "tcp", hp(cip(self), 80), "masq", []string{"a1"}},
		{"NodePort from outside is masqueraded", "ext", "tcp", hp("192.168.0.2", nodePort(np)), "masq", []string{"a1", "b1"}},
		{"NodePort on another node address is not served", "ext", "tcp", hp("203.0.113.1", nodePort(np)), "", []string{"refused"}},
		{"IPv6 NodePort from outside is masqueraded", "ext", "tcp", hp("fd00:192::2", nodePort(np)), "masq", []string{"a1", "b1"}},
		{"IPv6 externalTrafficPolicy Local keeps the client address and stays local", "ext", "tcp", hp("fd00:192::2", nodePort(loc)), "2001:db8:113::2", []string{"a1"}},
		{"IPv6 externalTrafficPolicy Local without a local endpoint drops", "ext", "tcp", hp("fd00:192::2", nodePort(remoteOnly)), "", []string{"timeout"}},
		{"externalTrafficPolicy Local keeps the client address and stays local", "ext", "tcp", hp("192.168.0.2", nodePort(loc)), "203.0.113.2", []string{"a1"}},
		{"externalTrafficPolicy Local on a LoadBalancer IP keeps the client address", "ext", "tcp", hp("198.51.100.4", 80), "203.0.113.2", []string{"a1"}},
		{"externalTrafficPolicy Local short-circuits pods to every endpoint", "a2", "tcp", hp("198.51.100.4", 80), "", []string{"a1", "b1"}},
		{"externalTrafficPolicy Local short-circuits the node itself to every endpoint", "node", "tcp", hp("192.168.0.2", nodePort(loc)), "masq", []string{"a1", "b1"}},
		{"externalTrafficPolicy Local without a local endpoint drops", "ext", "tcp", hp("192.168.0.2", nodePort(remoteOnly)), "", []string{"timeout"}},
		{"externalTrafficPolicy Local without a local endpoint short-circuits pods", "a2", "tcp", hp("192.168.0.2", nodePort(remoteOnly)), "", []string{"b1"}},
		{"externalTrafficPolicy Local without a local endpoint short-circuits the node itself", "node", "tcp", hp("192.168.0.2", nodePort(remoteOnly)), "masq", []string{"b1"}},
		{"externalTrafficPolicy Local without a local endpoint short-circuits pods on a LoadBalancer IP", "a2", "tcp", hp("198.51.100.5", 80), "", []string{"b1"}},
		{"IPv6 externalTrafficPolicy Local without a local endpoint short-circuits the node itself", "node", "tcp", hp("fd00:192::2", nodePort(remoteOnly)), "masq", []string{"b1"}},
		{"internalTrafficPolicy Local uses only local endpoints", "a2", "tcp", hp(cip(itp), 80), "", []string{"a1"}},
		{"internalTrafficPolicy Local without a local endpoint drops", "a2", "tcp", hp(cip(itpRemote), 80), "", []string{"timeout"}},
		{"terminating endpoints serve when none is ready", "a1", "tcp", hp(cip(term), 80), "", []string{"a2"}},
		{"zone hints keep traffic in the node's zone", "a2", "tcp", hp(cip(zonal), 80), "", []string{"a1"}},
		{"node hints win over zone hints", "a1", "tcp", hp(cip(nodal), 80), "", []string{"a2"}},
		{"hints for other zones only are ignored", "a2", "tcp", hp(cip(elsewhere), 80), "", []string{"a1", "b1"}},
		{"externalIPs are served", "ext", "tcp", hp("192.168.0.2", 8888), "masq", []string{"a1"}},
		{"IPv6 externalIPs are served", "ext", "tcp", hp("fd00:192::2", 8888), "masq", []string{"a1"}},
		{"LoadBalancer ingress IP is served", "ext", "tcp", hp("198.51.100.1", 80), "masq", []string{"a1"}},
		{"IPv6 LoadBalancer ingress IP is served", "ext", "tcp", hp("2001:db8:5100::6", 80), "masq", []string{"a1"}},
		{"LoadBalancer ingress IP with ipMode Proxy gets no rules", "ext", "tcp", hp("198.51.100.7", 80), "", []string{"timeout"}},
		{"loadBalancerSourceRanges drop other sources", "ext", "tcp", hp("198.51.100.2", 80), "", []string{"timeout"}},
		{"loadBalancerSourceRanges admit listed sources", "ext", "tcp", hp("198.51.100.3", 80), "masq", []string{"a1"}},
		{"NodePorts bypass loadBalancerSourceRanges, as in kube-proxy", "ext", "tcp", hp("192.168.0.2", nodePort(lbOpen)), "masq", []string{"a1"}},
	}
	for _, f := range flows {
		t.Run(f.name, func(t *testing.T) {
			l.t = t
			l.expect(f.from, f.network, f.to, f.seenAs, f.want...)
		})
	}

	t.Run("ClientIP affinity sticks to one endpoint", func(t *testing.T) {
		l.t = t
		first := hit(l.ns("a2"), "tcp", hp(cip(sticky), 80))
		if len(first) < 2 || !contains([]string{"a1", "a2", "b1"}, first[:2]) {
			t.Fatalf("no answer through the affinity Service: %q", first)
		}
		for i := 0; i < 15; i++ {
			if got := hit(l.ns("a2"), "tcp", hp(cip(sticky), 80)); len(got) < 2 || got[:2] != first[:2] {
				t.Fatalf("affinity broken: first %q, then %q", first, got)
			}
		}
	})

	t.Run("healthCheckNodePort reports local endpoints", func(t *testing.T) {
		l.t = t
		for _, c := range []struct {
			svc  *v1.Service
			code int
			body string
		}{{loc, 200, `"localEndpoints":1`}, {remoteOnly, 503, `"localEndpoints":0`}} {
			for _, ip := range []string{"192.168.0.2", "fd00:192::2"} { // the node-port addresses
				url := "http://" + hp(ip, c.svc.Spec.HealthCheckNodePort) + "/healthz"
				code, body := httpGet(l.ext, url)
				if code != c.code || !strings.Contains(body, c.body) {
					t.Errorf("GET %s: %d %s; want %d with %s", url, code, body, c.code, c.body)
				}
			}
		}
		// As kube-proxy, the server listens on the node-port addresses only.
		url := "http://" + hp("203.0.113.1", loc.Spec.HealthCheckNodePort) + "/healthz"
		if code, body := httpGet(l.ext, url); code != 0 || !strings.Contains(body, "refused") {
			t.Errorf("GET %s, not a node-port address: %d %s; want connection refused", url, code, body)
		}
	})

	t.Run("metrics are served", func(t *testing.T) {
		l.t = t
		code, body := l.metrics()
		for _, m := range []string{`netplane_node_sync_duration_seconds_count{feature="proxy",type="full"}`, `netplane_node_sync_duration_seconds_count{feature="proxy",type="partial"}`, "netplane_proxy_network_programming_duration_seconds", `netplane_proxy_no_local_endpoints{traffic_policy="external"} 2`} { // remote-only has two ports
			if code != 200 || !strings.Contains(body, m) {
				t.Errorf("/metrics lacks %s (status %d %.200s)", m, code, body)
			}
		}
	})

	t.Run("stale UDP conntrack entries are deleted when endpoints move", func(t *testing.T) {
		l.t = t
		dns := l.service("dns", []labEP{{pod: "a1"}})
		vip := hp(cip(dns), 53)
		const clientPort = 40053
		answeredBy := func(pod string) func() error {
			return func() error {
				if got := udpFrom(l.ns("a2"), clientPort, vip); !strings.HasPrefix(got, pod+" ") {
					return fmt.Errorf("answered %q", got)
				}
				return nil
			}
		}
		framework.EventuallyEvery(t, 100*time.Millisecond, 10*time.Second, "UDP through the new Service answered by a1", answeredBy("a1"))
		l.endpoints("dns", []labEP{{pod: "b1"}}) // a1 keeps running: only conntrack could send us there
		framework.EventuallyEvery(t, 100*time.Millisecond, 10*time.Second, "the same client flow answered by b1 after its endpoint moved there", answeredBy("b1"))
	})

	t.Run("nft flush table is healed within the sync period", func(t *testing.T) {
		l.t = t
		l.node.MustExec(t, "nft", "flush", "table", "ip", TableName)
		if got := hit(l.ns("a2"), "tcp", hp(cip(web), 80)); got != "timeout" && got != "refused" && got[:2] != "a1" && got[:2] != "b1" {
			t.Fatalf("unexpected %q", got)
		}
		start := time.Now()
		l.expect("a2", "tcp", hp(cip(web), 80), "10.244.1.3", "a1", "b1")
		t.Logf("healed within %v", time.Since(start).Round(time.Millisecond))
	})

	t.Run("a restart keeps open connections and rules, and the new process programs what changed meanwhile", func(t *testing.T) {
		l.t = t
		conn, err := l.ns("a2").DialEcho(hp(cip(self), 80), 3*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		talk(t, conn, "a1")
		l.c.Stop(l.agent)
		talk(t, conn, "a1")
		l.expect("a2", "tcp", hp(cip(web), 80), "10.244.1.3", "a1", "b1") // rules stay while the agent is down
		// Created while no agent runs: only the new process can program it.
		late := l.service("after-restart", []labEP{{pod: "b1"}})
		l.expect("a2", "tcp", hp(cip(late), 80), "", "timeout")
		l.start()
		framework.Eventually(t, 15*time.Second, "the new process's first full sync", func() error {
			code, body := l.metrics()
			if code != 200 || !firstFullSync.MatchString(body) {
				return fmt.Errorf("/metrics: %d, no full sync counted (%.200s)", code, body)
			}
			return nil
		})
		talk(t, conn, "a1") // the new process's sync kept the connection
		l.expect("a2", "tcp", hp(cip(web), 80), "10.244.1.3", "a1", "b1")
		l.expect("a2", "tcp", hp(cip(late), 80), "10.244.1.3", "b1")
	})

	t.Run("--masquerade-all masquerades pods reaching a ClusterIP too", func(t *testing.T) {
		l.t = t
		l.c.Stop(l.agent)
		l.flags = append(l.flags, "--masquerade-all")
		l.start()
		framework.Eventually(t, 15*time.Second, "the new process masquerades pod traffic in both families", func() error {
			for _, addr := range []string{hp(cip(web), 80), hp(cip6(web), 80)} {
				if got := hit(l.ns("a2"), "tcp", addr); strings.HasSuffix(got, " 10.244.1.3") || strings.HasSuffix(got, " fd00:244:1::3") || !strings.Contains(got, " ") {
					return errors.New(addr + ": " + got)
				}
			}
			return nil
		})
		l.expect("a2", "tcp", hp(cip(web), 80), "masq", "a1", "b1")
		l.expect("a2", "tcp", hp(cip6(web), 80), "masq", "a1", "b1")
		l.expect("ext", "tcp", hp("192.168.0.2", nodePort(loc)), "203.0.113.2", "a1") // Local policy still keeps the client address
	})
}

// firstFullSync matches the proxy's sync counter once a full sync is done.
var firstFullSync = regexp.MustCompile(`(?m)^netplane_node_sync_duration_seconds_count\{feature="proxy",type="full"\} [1-9]`)

// talk asks again on a long-lived connection and wants pod want to answer.
func talk(t *testing.T, c *netns.EchoConn, want string) {
	t.Helper()
	answer, err := c.Ask()
	if name, _ := netns.SplitAnswer(answer); err != nil || name != want {
		t.Fatalf("open connection: got %q, %v; want an answer from %s", answer, err, want)
	}
}

// loadBalancer makes a LoadBalancer Service; of the ips, CIDRs are its
// source ranges and addresses its ingress IPs.
func loadBalancer(ips ...string) svcOpt {
	return func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeLoadBalancer
		for _, ip := range ips {
			if strings.Contains(ip, "/") {
				s.Spec.LoadBalancerSourceRanges = append(s.Spec.LoadBalancerSourceRanges, ip)
			} else {
				s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, v1.LoadBalancerIngress{IP: ip})
			}
		}
	}
}

func httpGet(ns interface{ Do(func() error) error }, url string) (int, string) {
	var code int
	var body string
	// The transport dials on goroutines of its own, so the connection is made
	// inside the namespace explicitly; never from the test's own namespace.
	dial := func(_ context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := ns.Do(func() (err error) { c, err = net.DialTimeout(network, addr, 2*time.Second); return err })
		return c, err
	}
	c := http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, DialContext: dial, Proxy: nil}}
	resp, err := c.Get(url)
	if err == nil {
		defer resp.Body.Close()
		var b []byte
		b, err = io.ReadAll(resp.Body)
		code, body = resp.StatusCode, string(b)
	}
	if err != nil {
		return 0, err.Error()
	}
	return code, body
}

// udpFrom sends one datagram from a fixed client port, so every call is the
// same conntrack flow, and returns the answer ("" on timeout).
func udpFrom(ns interface{ Do(func() error) error }, port int, addr string) string {
	var reply string
	_ = ns.Do(func() error {
		c, err := net.DialUDP("udp", &net.UDPAddr{Port: port}, net.UDPAddrFromAddrPort(netip.MustParseAddrPort(addr)))
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(500 * time.Millisecond))
		if _, err := c.Write([]byte("q")); err != nil {
			return err
		}
		buf := make([]byte, 128)
		n, err := c.Read(buf)
		reply = strings.TrimSpace(string(buf[:n]))
		return err
	})
	return reply
}
