package proxy

import (
	"bufio"
	"net"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

// TestFlowsThroughTheNodeRole runs `netplane --role=node` in a node
// namespace against a real API server and checks the packet-flow table:
// {source, protocol, destination, port} → {backends | refused | dropped,
// client address seen}.
func TestFlowsThroughTheNodeRole(t *testing.T) {
	l := newLab(t)
	web := l.service("web", []labEP{{pod: "a1"}, {pod: "b1"}})
	empty := l.service("empty", nil)
	self := l.service("self", []labEP{{pod: "a1"}})
	np := l.service("np", []labEP{{pod: "a1"}, {pod: "b1"}}, func(s *v1.Service) { s.Spec.Type = v1.ServiceTypeNodePort })
	loc := l.service("local", []labEP{{pod: "a1"}, {pod: "b1"}}, func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeNodePort
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	})
	remoteOnly := l.service("remote-only", []labEP{{pod: "b1"}}, func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeNodePort
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	})
	itp := l.service("itp", []labEP{{pod: "a1"}, {pod: "b1"}}, func(s *v1.Service) {
		s.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyLocal)
	})
	sticky := l.service("sticky", []labEP{{pod: "a1"}, {pod: "a2"}, {pod: "b1"}}, func(s *v1.Service) {
		s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
	})
	term := l.service("term", []labEP{{pod: "a2", terminating: true}})
	l.service("extip", []labEP{{pod: "a1"}}, func(s *v1.Service) {
		s.Spec.ExternalIPs = []string{"192.168.0.2"}
		s.Spec.Ports = s.Spec.Ports[:1]
		s.Spec.Ports[0].Port = 8888
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
		{"ClusterIP from the node itself is masqueraded", "node", "tcp", hp(cip(web), 80), "", []string{"a1", "b1"}},
		{"unknown port on a ClusterIP is rejected", "a2", "tcp", hp(cip(web), 81), "", []string{"refused"}},
		{"Service without endpoints is rejected", "a2", "tcp", hp(cip(empty), 80), "", []string{"refused"}},
		{"hairpin: a pod reaching itself is masqueraded", "a1", "tcp", hp(cip(self), 80), "masq", []string{"a1"}},
		{"NodePort from outside is masqueraded", "ext", "tcp", hp("192.168.0.2", nodePort(np)), "masq", []string{"a1", "b1"}},
		{"NodePort on another node address is not served", "ext", "tcp", hp("203.0.113.1", nodePort(np)), "", []string{"refused"}},
		{"externalTrafficPolicy Local keeps the client address and stays local", "ext", "tcp", hp("192.168.0.2", nodePort(loc)), "203.0.113.2", []string{"a1"}},
		{"externalTrafficPolicy Local short-circuits pods to every endpoint", "a2", "tcp", hp(cip(loc), 80), "", []string{"a1", "b1"}},
		{"externalTrafficPolicy Local without a local endpoint drops", "ext", "tcp", hp("192.168.0.2", nodePort(remoteOnly)), "", []string{"timeout"}},
		{"internalTrafficPolicy Local uses only local endpoints", "a2", "tcp", hp(cip(itp), 80), "", []string{"a1"}},
		{"terminating endpoints serve when none is ready", "a1", "tcp", hp(cip(term), 80), "", []string{"a2"}},
		{"externalIPs are served", "ext", "tcp", hp("192.168.0.2", 8888), "masq", []string{"a1"}},
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

	t.Run("a restart keeps open connections and rules", func(t *testing.T) {
		l.t = t
		conn, err := dialNS(l.ns("a2"), hp(cip(self), 80))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		talk(t, conn, "a1")
		l.proc.Stop(10 * time.Second)
		talk(t, conn, "a1")
		l.expect("a2", "tcp", hp(cip(web), 80), "10.244.1.3", "a1", "b1") // rules stay while the agent is down
		l.start(netplaneBinary(t))
		time.Sleep(2 * time.Second) // a few syncs of the new process
		talk(t, conn, "a1")
		l.expect("a2", "tcp", hp(cip(web), 80), "10.244.1.3", "a1", "b1")
	})
}

func dialNS(ns interface{ Do(func() error) error }, addr string) (net.Conn, error) {
	var c net.Conn
	err := ns.Do(func() (err error) { c, err = net.DialTimeout("tcp", addr, 2*time.Second); return err })
	return c, err
}

// talk reads one answer on a long-lived connection and asks for the next.
func talk(t *testing.T, c net.Conn, want string) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, want+" ") {
		t.Fatalf("open connection: got %q, %v; want an answer from %s", line, err, want)
	}
	if _, err := c.Write([]byte("again\n")); err != nil {
		t.Fatal(err)
	}
}
