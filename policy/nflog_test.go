package policy

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	netv1 "k8s.io/api/networking/v1"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/internal/informer"
	"github.com/netplane/netplane/internal/role"
	"github.com/netplane/netplane/nft"
)

// ipv4 is an IPv4 header of 20 bytes, then l4.
func ipv4(proto uint8, src, dst string, fragOff uint16, l4 []byte) []byte {
	b := make([]byte, 20)
	b[0] = 0x45
	binary.BigEndian.PutUint16(b[6:], fragOff)
	b[9] = proto
	s, d := netip.MustParseAddr(src).As4(), netip.MustParseAddr(dst).As4()
	copy(b[12:], s[:])
	copy(b[16:], d[:])
	return append(b, l4...)
}

// ipv6 is an IPv6 header, the extension headers given (each 8 bytes,
// its next header first), then l4.
func ipv6(next uint8, src, dst string, rest ...[]byte) []byte {
	b := make([]byte, 40)
	b[0] = 0x60
	b[6] = next
	s, d := netip.MustParseAddr(src).As16(), netip.MustParseAddr(dst).As16()
	copy(b[8:], s[:])
	copy(b[24:], d[:])
	for _, r := range rest {
		b = append(b, r...)
	}
	return b
}

var ports4000to80 = []byte{0x0f, 0xa0, 0, 80, 0, 0, 0, 0}

func TestDeniedPacketsAreParsedFromTheirHeaders(t *testing.T) {
	for _, tc := range []struct {
		name   string
		packet []byte
		want   string // "" when unreadable
	}{
		{"IPv4 TCP", ipv4(unix.IPPROTO_TCP, "10.0.0.1", "10.0.0.2", 0, ports4000to80), "6 10.0.0.1:4000 10.0.0.2:80"},
		{"IPv4 SCTP", ipv4(unix.IPPROTO_SCTP, "10.0.0.1", "10.0.0.2", 0, ports4000to80), "132 10.0.0.1:4000 10.0.0.2:80"},
		{"IPv4 ICMP has no ports", ipv4(unix.IPPROTO_ICMP, "10.0.0.1", "10.0.0.2", 0, ports4000to80), "1 10.0.0.1:0 10.0.0.2:0"},
		{"IPv4 later fragment has no ports", ipv4(unix.IPPROTO_UDP, "10.0.0.1", "10.0.0.2", 185, ports4000to80), "17 10.0.0.1:0 10.0.0.2:0"},
		{"IPv4 cut short", ipv4(unix.IPPROTO_TCP, "10.0.0.1", "10.0.0.2", 0, nil)[:12], ""},
		{"IPv6 UDP", ipv6(unix.IPPROTO_UDP, "fd00::1", "fd00::2", ports4000to80), "17 [fd00::1]:4000 [fd00::2]:80"},
		{"IPv6 through a hop-by-hop header", ipv6(unix.IPPROTO_HOPOPTS, "fd00::1", "fd00::2", []byte{unix.IPPROTO_TCP, 0, 0, 0, 0, 0, 0, 0}, ports4000to80),
			"6 [fd00::1]:4000 [fd00::2]:80"},
		{"IPv6 first fragment", ipv6(unix.IPPROTO_FRAGMENT, "fd00::1", "fd00::2", []byte{unix.IPPROTO_TCP, 0, 0, 1, 0, 0, 0, 1}, ports4000to80),
			"6 [fd00::1]:4000 [fd00::2]:80"},
		{"IPv6 later fragment", ipv6(unix.IPPROTO_FRAGMENT, "fd00::1", "fd00::2", []byte{unix.IPPROTO_TCP, 0, 0, 0x10, 0, 0, 0, 1}, ports4000to80),
			"6 [fd00::1]:0 [fd00::2]:0"},
		{"neither", []byte{0x10, 1, 2, 3}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, ok := parsePacket(deniedPacket{}, tc.packet)
			got := ""
			if ok {
				got = fmt.Sprintf("%d %s %s", p.Proto, p.Src, p.Dst)
			}
			if got != tc.want {
				t.Errorf("parsed %q, want %q", got, tc.want)
			}
		})
	}
}

func TestNFLOGMessagesGiveTheDirectionFromTheirPrefix(t *testing.T) {
	msg := func(prefix string) netlink.Message {
		attrs, _ := netlink.MarshalAttributes([]netlink.Attribute{
			{Type: nfulaPrefix, Data: append([]byte(prefix), 0)},
			{Type: nfulaPayload, Data: ipv4(unix.IPPROTO_TCP, "10.0.0.1", "10.0.0.2", 0, ports4000to80)}})
		return netlink.Message{Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_ULOG<<8 | nfulnlMsgPacket)},
			Data: append([]byte{unix.AF_INET, 0, 0, 0}, attrs...)}
	}
	for _, tc := range []struct {
		prefix string
		ok     bool
		dir    Direction
	}{{logPrefix + "ingress ", true, Ingress}, {logPrefix + "egress ", true, Egress}, {"someone else's ", false, 0}, {logPrefix + "sideways ", false, 0}} {
		p, ok := parseNFLOG(msg(tc.prefix))
		if ok != tc.ok || (ok && p.Dir != tc.dir) {
			t.Errorf("prefix %q: ok=%v direction %v, want ok=%v %v", tc.prefix, ok, p.Dir, tc.ok, tc.dir)
		}
	}
}

// TestKernelLogsOneLinePerDeniedConnection runs the feature with
// --network-policy-log-denied on the kernel lab: each denied connection
// gives one line naming the pod the policy protects, however many packets
// it sent.
func TestKernelLogsOneLinePerDeniedConnection(t *testing.T) {
	l := newLab(t)
	d, closeNS, err := nft.NamespaceDialer(l.node.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer closeNS()
	var mu sync.Mutex
	var lines []string
	log := funcr.New(func(prefix, args string) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, args)
	}, funcr.Options{})
	cfg := v1alpha1.Node{NodeName: "n1", NetworkPolicy: v1alpha1.NetworkPolicy{Enabled: true, LogDenied: true}}
	prog := nft.NewProgrammer(d, TableID)
	defer prog.Close()
	e, err := newFeature(role.Deps{Config: &v1alpha1.Configuration{Node: cfg}, Checks: role.NewChecks(), Log: log}, prog, newMetrics(), nil)
	if err != nil {
		t.Fatal(err)
	}
	e.dialer = d
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go e.logDenied(ctx)
	pods, nss, pols := &sink{e: e, kind: informer.Pods}, &sink{e: e, kind: informer.Namespaces}, &sink{e: e, kind: informer.NetworkPolicies}
	for _, ns := range l.c.namespaces {
		must(t, nss.Add(NamespaceFromAPI(ns)))
	}
	for _, p := range l.c.pods {
		must(t, pods.Add(PodFromAPI(p)))
	}
	must(t, pols.Add(policyRecordOf(policy("x", "deny", netv1.NetworkPolicySpec{PodSelector: *all, PolicyTypes: ingressOnly}))))
	must(t, pols.Add(policyRecordOf(policy("y", "b-out", netv1.NetworkPolicySpec{PodSelector: *sel("pod", "b"), PolicyTypes: egressOnly}))))
	if err := e.sync(ctx, true); err != nil {
		t.Fatal(err)
	}

	udpPort := deniedConnections(t, l)
	want := []string{
		`"direction"="ingress" "protocol"="tcp" "source"="10.244.0.4:` + `*" "destination"="10.244.0.2:80" "port"=80 "pod"="x/a"`,
		`"direction"="ingress" "protocol"="udp" "source"="10.244.0.4:` + udpPort + `" "destination"="10.244.0.3:81" "port"=81 "pod"="x/b"`,
		`"direction"="egress" "protocol"="tcp" "source"="10.244.0.5:` + `*" "destination"="10.244.0.4:81" "port"=81 "pod"="y/b"`,
	}
	if n, err := deniedPackets(namespaceCounter{d})(); err != nil || n[Ingress] < 5 {
		t.Fatalf("denied ingress packets %v (%v), want at least 5: two SYNs and three datagrams", n, err)
	}
	framework.Eventually(t, 3*time.Second, "one log line per denied connection", func() error {
		mu.Lock()
		got := slices.Clone(lines)
		mu.Unlock()
		if problem := matchLines(got, want); problem != "" {
			return fmt.Errorf("%s\nlines:\n%s", problem, strings.Join(got, "\n"))
		}
		return nil
	})
}

// deniedConnections: y/a opens a TCP connection to x/a (its SYN sent
// twice) and sends three datagrams from one socket to x/b; y/b opens one
// to y/a. It returns the datagrams' source port.
func deniedConnections(t *testing.T, l *lab) string {
	var udpPort string
	must(t, l.pods["y/a"].Do(func() error {
		c, err := net.DialTimeout("tcp4", "10.244.0.2:80", 1500*time.Millisecond) // the SYN is sent twice
		if err == nil {
			c.Close()
			return fmt.Errorf("y/a -> x/a got through")
		}
		u, err := net.Dial("udp4", "10.244.0.3:81")
		if err != nil {
			return err
		}
		defer u.Close()
		for range 3 {
			u.Write([]byte("ping"))
		}
		_, udpPort, _ = net.SplitHostPort(u.LocalAddr().String())
		return nil
	}))
	must(t, l.pods["y/b"].Do(func() error {
		c, err := net.DialTimeout("tcp4", "10.244.0.4:81", 300*time.Millisecond)
		if err == nil {
			c.Close()
			return fmt.Errorf("y/b -> y/a got through")
		}
		return nil
	}))
	return udpPort
}

// matchLines says what is wrong unless every wanted line (a * stands for
// a source port) is logged exactly once and nothing else is.
func matchLines(got, want []string) string {
	for _, w := range want {
		before, after, _ := strings.Cut(w, "*")
		n := 0
		for _, g := range got {
			if strings.Contains(g, `"msg"="denied connection"`) && strings.Contains(g, before) && strings.Contains(g, after) {
				n++
			}
		}
		if n != 1 {
			return fmt.Sprintf("%d lines like %s, want 1", n, w)
		}
	}
	if len(got) != len(want) {
		return fmt.Sprintf("%d lines, want %d", len(got), len(want))
	}
	return ""
}
