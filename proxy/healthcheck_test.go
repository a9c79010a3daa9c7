package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"

	"github.com/netplane/netplane/e2e/netns"
)

func freePort(t *testing.T) uint16 {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return uint16(l.Addr().(*net.TCPAddr).Port)
}

var loopback = []netip.Addr{netip.MustParseAddr("127.0.0.1")}

func TestHealthCheckNodePortAnswersLikeKubeProxy(t *testing.T) {
	var healthy atomic.Bool
	healthy.Store(true)
	h := newHealthServers(logr.Discard(), healthy.Load)
	defer h.Close(t.Context())
	port := freePort(t)
	svc := types.NamespacedName{Namespace: "ns", Name: "web"}
	get := func() (int, map[string]any, string) {
		t.Helper()
		c := http.Client{Timeout: 2 * time.Second}
		resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/", port))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, body, resp.Header.Get("X-Load-Balancing-Endpoint-Weight")
	}

	h.Sync(map[types.NamespacedName]HealthInfo{svc: {Port: port, LocalEndpoints: 2, Addrs: loopback}})
	code, body, weight := get()
	if code != 200 || body["localEndpoints"] != float64(2) || body["serviceProxyHealthy"] != true || weight != "2" {
		t.Errorf("two local endpoints: got %d %v weight %q, want 200, localEndpoints 2, weight 2", code, body, weight)
	}
	if s, _ := body["service"].(map[string]any); s["namespace"] != "ns" || s["name"] != "web" {
		t.Errorf("service in body: %v", body["service"])
	}

	h.Sync(map[types.NamespacedName]HealthInfo{svc: {Port: port, LocalEndpoints: 0, Addrs: loopback}})
	if code, body, _ := get(); code != 503 || body["localEndpoints"] != float64(0) {
		t.Errorf("no local endpoint: got %d %v, want 503", code, body)
	}

	h.Sync(map[types.NamespacedName]HealthInfo{svc: {Port: port, LocalEndpoints: 1, Addrs: loopback}})
	healthy.Store(false)
	if code, body, _ := get(); code != 503 || body["serviceProxyHealthy"] != false {
		t.Errorf("unhealthy proxy: got %d %v, want 503", code, body)
	}

	h.Sync(nil)
	if _, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second); err == nil {
		t.Error("the port still answers after its Service went away")
	}
}

// The node-port addresses of the test are loopback ones: 127.0.0.2 is as
// much this host's as 127.0.0.1, so a listener on ":port" would answer both.
func TestHealthCheckNodePortListensOnlyOnTheNodePortAddresses(t *testing.T) {
	h := newHealthServers(logr.Discard(), func() bool { return true })
	defer h.Close(t.Context())
	port := freePort(t)
	svc := types.NamespacedName{Namespace: "ns", Name: "web"}
	answers := func(ip string) bool {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(ip, fmt.Sprint(port)), time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	}
	h.Sync(map[types.NamespacedName]HealthInfo{svc: {Port: port, LocalEndpoints: 1, Addrs: loopback}})
	if !answers("127.0.0.1") || answers("127.0.0.2") {
		t.Errorf("bound to 127.0.0.1: 127.0.0.1 answers %v (want true), 127.0.0.2 answers %v (want false)", answers("127.0.0.1"), answers("127.0.0.2"))
	}
	h.Sync(map[types.NamespacedName]HealthInfo{svc: {Port: port, LocalEndpoints: 1, Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.2")}}})
	if answers("127.0.0.1") || !answers("127.0.0.2") {
		t.Errorf("moved to 127.0.0.2: 127.0.0.1 answers %v (want false), 127.0.0.2 answers %v (want true)", answers("127.0.0.1"), answers("127.0.0.2"))
	}
}

func TestHealthCheckAddressesFollowNodePortAddresses(t *testing.T) {
	ips := []netip.Addr{netip.MustParseAddr("192.168.0.2"), netip.MustParseAddr("2001:db8::1")}
	cases := []struct {
		name   string
		spec   []string
		listen []listenAddr
	}{
		{"primary IPs by default", nil, []listenAddr{{"tcp4", "192.168.0.2:30000"}, {"tcp6", "[2001:db8::1]:30000"}}},
		{"CIDRs select node addresses", []string{"192.168.0.0/16", "2001:db8::/64"}, []listenAddr{{"tcp4", "192.168.0.2:30000"}, {"tcp6", "[2001:db8::1]:30000"}}},
		{"0.0.0.0/0 is every IPv4 address", []string{"0.0.0.0/0", "2001:db8::/64"}, []listenAddr{{"tcp4", "0.0.0.0:30000"}, {"tcp6", "[2001:db8::1]:30000"}}},
		{"::/0 is every IPv6 address, IPv6-only", []string{"::/0", "primary"}, []listenAddr{{"tcp4", "192.168.0.2:30000"}, {"tcp6", "[::]:30000"}}},
		{"both families: one dual-stack socket", []string{"0.0.0.0/0", "::/0"}, []listenAddr{{"tcp", ":30000"}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := listenAddrs(healthCheckIPs(c.spec, ips), 30000); !slices.Equal(got, c.listen) {
				t.Errorf("--nodeport-addresses=%v: listens on %v, want %v", c.spec, got, c.listen)
			}
		})
	}
}

// The wildcards are tried in a namespace of the test's own, on its loopback
// addresses, so nothing listens on the machine's interfaces.
func TestHealthCheckNodePortWildcardsListenOnEveryAddressOfTheirFamily(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a network namespace")
	}
	ns := netns.New(t, "healthcheck")
	port := freePort(t)
	svc := types.NamespacedName{Namespace: "ns", Name: "web"}
	addrs := func(ss ...string) []netip.Addr {
		var out []netip.Addr
		for _, s := range ss {
			out = append(out, netip.MustParseAddr(s))
		}
		return out
	}
	cases := []struct {
		name             string
		bind             []netip.Addr
		answer, refusing []string
	}{
		{"both wildcards: one dual-stack socket", addrs("0.0.0.0", "::"), []string{"127.0.0.1", "127.0.0.2", "::1"}, nil},
		{"IPv4 wildcard beside one IPv6 address", addrs("0.0.0.0", "::1"), []string{"127.0.0.1", "127.0.0.2", "::1"}, nil},
		{"IPv6 wildcard is IPv6-only, beside one IPv4 address", addrs("127.0.0.1", "::"), []string{"127.0.0.1", "::1"}, []string{"127.0.0.2"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHealthServers(logr.Discard(), func() bool { return true })
			defer h.Close(t.Context())
			if err := ns.Do(func() error {
				h.Sync(map[types.NamespacedName]HealthInfo{svc: {Port: port, LocalEndpoints: 1, Addrs: c.bind}})
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if n := len(h.servers[port].srvs); n != len(listenAddrs(c.bind, port)) {
				t.Fatalf("%d of %d listeners opened", n, len(listenAddrs(c.bind, port)))
			}
			for _, ip := range append(append([]string{}, c.answer...), c.refusing...) {
				err := ns.Do(func() error {
					conn, err := net.DialTimeout("tcp", net.JoinHostPort(ip, fmt.Sprint(port)), time.Second)
					if err == nil {
						conn.Close()
					}
					return err
				})
				if want := slices.Contains(c.answer, ip); (err == nil) != want {
					t.Errorf("bound to %v: %s answers: %v, want %v", c.bind, ip, err == nil, want)
				}
			}
		})
	}
}

func TestHealthCheckNodePortRetriesAFailedListenAtTheNextSync(t *testing.T) {
	h := newHealthServers(logr.Discard(), func() bool { return true })
	defer h.Close(t.Context())
	blocker, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := uint16(blocker.Addr().(*net.TCPAddr).Port)
	want := map[types.NamespacedName]HealthInfo{{Namespace: "ns", Name: "web"}: {Port: port, LocalEndpoints: 1, Addrs: loopback}}
	h.Sync(want) // the port is taken: nothing listens
	blocker.Close()
	h.Sync(want)
	code, body := 0, ""
	if resp, err := (&http.Client{Timeout: 2 * time.Second}).Get(fmt.Sprintf("http://127.0.0.1:%d/", port)); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		code, body = resp.StatusCode, string(b)
	}
	if code != 200 || !strings.Contains(body, `"localEndpoints":1`) {
		t.Errorf("after the port was freed: got %d %q, want 200 from the health-check server", code, body)
	}
}
