package dns

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/netplane/netplane/apis/config/v1alpha1"
)

func TestTheLongestStubDomainWins(t *testing.T) {
	r := newRoutes(forwarding{
		stubs: map[string][]string{
			"corp.example":       {"10.0.0.1"},
			"Lab.Corp.Example.":  {"10.0.0.2:5353"},
			"in-addr.arpa":       {"fd00::53"},
			"10.in-addr.arpa.":   {"[fd00::54]:5353"},
			"deep.a.b.c.example": {"10.0.0.3"},
		},
		upstreams: []string{"192.0.2.53"},
	}, nil)
	cases := []struct{ name, want string }{
		{"corp.example.", "10.0.0.1:53"},
		{"www.corp.example.", "10.0.0.1:53"},
		{"lab.corp.example.", "10.0.0.2:5353"},
		{"a.b.lab.corp.example.", "10.0.0.2:5353"},
		{"xlab.corp.example.", "10.0.0.1:53"}, // a label, not a suffix of characters
		{"xcorp.example.", "192.0.2.53:53"},
		{"example.", "192.0.2.53:53"},
		{".", "192.0.2.53:53"},
		{"1.2.0.192.in-addr.arpa.", "[fd00::53]:53"},
		{"1.0.0.10.in-addr.arpa.", "[fd00::54]:5353"},
		{"c.example.", "192.0.2.53:53"},
		{"x.deep.a.b.c.example.", "10.0.0.3:53"},
	}
	for _, c := range cases {
		if got := strings.Join(r.route(c.name).addrs, ","); got != c.want {
			t.Errorf("%s goes to %s, want %s", c.name, got, c.want)
		}
	}
	if none := newRoutes(forwarding{upstreams: []string{"192.0.2.53"}}, nil); none.route("www.corp.example.") != none.upstream {
		t.Error("without stub domains a name does not go to the upstream servers")
	}
}

// A route whose servers did not change keeps its servers, and so its
// cached answers; a changed or new one gets servers of its own.
func TestReroutingKeepsTheServersOfUnchangedRoutes(t *testing.T) {
	before := newRoutes(forwarding{stubs: map[string][]string{"a.example": {"10.0.0.1"}, "b.example": {"10.0.0.2"}}, upstreams: []string{"192.0.2.53"}}, nil)
	after := newRoutes(forwarding{stubs: map[string][]string{"a.example.": {"10.0.0.1:53"}, "b.example": {"10.0.0.3"}, "c.example": {"10.0.0.1"}}, upstreams: []string{"192.0.2.53"}}, before)
	for _, c := range []struct {
		name string
		same bool
	}{{"x.a.example.", true}, {"x.b.example.", false}, {"x.c.example.", false}, {"x.example.", true}} {
		if got := before.route(c.name) == after.route(c.name); got != c.same {
			t.Errorf("%s keeps its servers: %v, want %v", c.name, got, c.same)
		}
	}
}

func TestCachedAnswersAreKeptApartByTheirServers(t *testing.T) {
	f := NewForwarder(nil, time.Second, NewCache(100, time.Hour, 0), nil)
	before := f.Reroute(forwarding{stubs: map[string][]string{"corp.example": {"10.0.0.1"}}, upstreams: []string{"192.0.2.53"}})
	m := new(dns.Msg)
	m.Answer = rrs(t, "www.corp.example. 100 IN A 10.1.1.1")
	inStub := keyOf(dns.Question{Name: "www.corp.example.", Qtype: dns.TypeA, Qclass: dns.ClassINET}, false)
	outside := keyOf(dns.Question{Name: "www.example.", Qtype: dns.TypeA, Qclass: dns.ClassINET}, false)
	f.cache.Put(inStub, m, before.route(inStub.name))
	f.cache.Put(outside, m, before.route(outside.name))
	if got, _ := f.cache.Get(inStub, before.upstream); got != nil {
		t.Error("the stub domain's answer is served for the upstream servers")
	}
	after := newRoutes(forwarding{stubs: map[string][]string{"corp.example": {"10.0.0.2"}}, upstreams: []string{"192.0.2.53"}}, before)
	if got, _ := f.cache.Get(inStub, after.route(inStub.name)); got != nil {
		t.Error("an answer of the stub domain's old server is served after its servers changed")
	}
	after = f.Reroute(forwarding{stubs: map[string][]string{"corp.example": {"10.0.0.2"}}, upstreams: []string{"192.0.2.53"}})
	if n := f.cache.Len(); n != 1 {
		t.Errorf("%d entries after the stub domain changed, want 1 (the upstream answer)", n)
	}
	if got, state := f.cache.Get(outside, after.route(outside.name)); got == nil || state != fresh {
		t.Error("an answer of unchanged servers was dropped")
	}
}

func TestStaleDecisions(t *testing.T) {
	t0 := time.Unix(1000, 0)
	cases := []struct {
		name    string
		now     time.Time
		window  time.Duration
		failing bool
		want    freshness
	}{
		{"within its TTL", t0.Add(-time.Second), time.Minute, false, fresh},
		{"within its TTL, servers failing", t0.Add(-time.Second), time.Minute, true, fresh},
		{"expired, serve-stale off", t0.Add(time.Second), 0, true, absent},
		{"just expired: ask the servers first", t0, time.Minute, false, staleVerify},
		{"expired, servers not asked since", t0.Add(30 * time.Second), time.Minute, false, staleVerify},
		{"expired, servers failed: serve at once", t0.Add(30 * time.Second), time.Minute, true, staleServe},
		{"past the window", t0.Add(time.Minute), time.Minute, true, absent},
		{"long past the window", t0.Add(time.Hour), time.Minute, false, absent},
	}
	for _, c := range cases {
		if got := judge(c.now, t0, c.window, c.failing); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// A stale answer has every TTL at most 30 s; a full shard drops the entry
// whose serving ends first, so answers kept for serve-stale outlive
// answers that can no longer be served.
func TestStaleAnswersAndEviction(t *testing.T) {
	c := NewCache(cacheShards, time.Hour, time.Minute) // one entry per shard
	now := time.Unix(1000, 0)
	c.now = func() time.Time { return now }
	via := &servers{}
	m := new(dns.Msg)
	m.Answer = rrs(t, "a.example. 100 IN A 192.0.2.1")
	m.Ns = rrs(t, "example. 3600 IN NS ns.example.")
	k := keyOf(dns.Question{Name: "a.example.", Qtype: dns.TypeA, Qclass: dns.ClassINET}, false)
	c.Put(k, m, via)
	now = now.Add(130 * time.Second)
	got, state := c.Get(k, via)
	if state != staleVerify || got == nil {
		t.Fatalf("30s after expiry: %v, want a stale answer to verify", state)
	}
	for _, rr := range append(got.Answer, got.Ns...) {
		if rr.Header().Ttl > staleTTL {
			t.Errorf("stale record with TTL %d: %s", rr.Header().Ttl, rr)
		}
	}
	c.Failing(k, via)
	if _, state := c.Get(k, via); state != staleServe {
		t.Errorf("after a failed refresh: %v, want stale to serve at once", state)
	}

	// Fill the shard of a fresh key with one dead entry: a new key in it
	// replaces the dead one.
	sh := &c.shards[shardOf(k)%cacheShards]
	sh.m[k] = cacheEntry{msg: m, via: via, stored: now.Add(-time.Hour), expires: now.Add(-2 * time.Minute)}
	c.perCap = 2
	c.Put(keyBeside(k, "b"), m, via)
	c.Put(keyBeside(k, "c"), m, via)
	if _, ok := sh.m[k]; ok {
		t.Error("a full shard kept an entry past serve-stale and dropped a live one")
	}
	if len(sh.m) != 2 {
		t.Errorf("shard holds %d entries, its bound is 2", len(sh.m))
	}
}

// keyBeside is a key of a name starting with prefix in the shard of k.
func keyBeside(k cacheKey, prefix string) cacheKey {
	for i := 0; ; i++ {
		other := keyOf(dns.Question{Name: fmt.Sprintf("%s%d.example.", prefix, i), Qtype: dns.TypeA, Qclass: dns.ClassINET}, false)
		if shardOf(other)%cacheShards == shardOf(k)%cacheShards {
			return other
		}
	}
}

func TestKubeDNSConfigMap(t *testing.T) {
	cases := []struct {
		name string
		data map[string]string
		want string // forwarding as fmt prints it, or the error's text
		err  bool
	}{
		{"empty", nil, "{map[] []}", false},
		{"Kubernetes' example", map[string]string{
			"stubDomains":         `{"acme.local": ["1.2.3.4"]}`,
			"upstreamNameservers": `["8.8.8.8", "8.8.4.4"]`,
		}, "{map[acme.local:[1.2.3.4]] [8.8.8.8 8.8.4.4]}", false},
		{"ports and IPv6", map[string]string{"stubDomains": `{"corp.example.": ["10.0.0.53:5353", "fd00::53", "[fd00::54]:5353"]}`},
			"{map[corp.example.:[10.0.0.53:5353 fd00::53 [fd00::54]:5353]] []}", false},
		{"federations is obsolete and ignored", map[string]string{"federations": `{"myfed": "example.com"}`}, "{map[] []}", false},
		{"blank values set nothing", map[string]string{"stubDomains": " ", "upstreamNameservers": ""}, "{map[] []}", false},
		{"not JSON", map[string]string{"stubDomains": `{"acme.local": ["1.2.3.4"]`},
			`data.stubDomains: must be a JSON object of domain to list of servers, like {"corp.example": ["10.0.0.53"]}: unexpected end of JSON input`, true},
		{"a server as a string, not a list", map[string]string{"stubDomains": `{"acme.local": "1.2.3.4"}`},
			"data.stubDomains: must be a JSON object of domain to list of servers", true},
		{"upstreams as an object", map[string]string{"upstreamNameservers": `{"a": 1}`},
			"data.upstreamNameservers: must be a JSON list of servers", true},
		{"four upstreams", map[string]string{"upstreamNameservers": `["1.1.1.1", "1.0.0.1", "8.8.8.8", "8.8.4.4"]`},
			"data.upstreamNameservers: lists 4 servers, at most 3 are allowed", true},
		{"a server by name", map[string]string{"stubDomains": `{"acme.local": ["ns.acme.local"]}`},
			`data.stubDomains[acme.local][0]: must be an IP address or IP:port, got "ns.acme.local"`, true},
		{"an upstream by name", map[string]string{"upstreamNameservers": `["dns.google"]`},
			`data.upstreamNameservers[0]: must be an IP address or IP:port, got "dns.google"`, true},
		{"the cluster domain", map[string]string{"stubDomains": `{"cluster.local": ["1.2.3.4"]}`},
			"data.stubDomains[cluster.local]: is inside the cluster domain cluster.local, which netplane answers itself", true},
		{"inside the cluster domain", map[string]string{"stubDomains": `{"svc.Cluster.Local.": ["1.2.3.4"]}`},
			"data.stubDomains[svc.Cluster.Local.]: is inside the cluster domain cluster.local", true},
		{"a domain that ends like the cluster domain", map[string]string{"stubDomains": `{"mycluster.local": ["1.2.3.4"]}`},
			"{map[mycluster.local:[1.2.3.4]] []}", false},
		{"the root", map[string]string{"stubDomains": `{".": ["1.2.3.4"]}`},
			"data.stubDomains[.]: the root is no stub domain: list its servers in upstreamServers", true},
		{"no servers", map[string]string{"stubDomains": `{"acme.local": []}`},
			"data.stubDomains[acme.local]: must list at least one server", true},
		{"one domain twice", map[string]string{"stubDomains": `{"acme.local": ["1.2.3.4"], "ACME.local.": ["1.2.3.5"]}`},
			`data.stubDomains[acme.local]: names the same domain as "ACME.local."`, true},
		{"every error", map[string]string{"stubDomains": `{"cluster.local": ["x"]}`, "upstreamNameservers": `["y"]`},
			"data.upstreamNameservers[0]: must be an IP address or IP:port, got \"y\"\n" +
				"data.stubDomains[cluster.local]: is inside the cluster domain cluster.local, which netplane answers itself: forward a domain outside it\n" +
				"data.stubDomains[cluster.local][0]: must be an IP address or IP:port, got \"x\"", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fw, err := parseKubeDNS(c.data, "cluster.local")
			if c.err {
				if err == nil || !strings.Contains(err.Error(), c.want) {
					t.Fatalf("error %v, want %q", err, c.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := fmt.Sprint(forwarding{stubs: orEmpty(fw.stubs), upstreams: fw.upstreams}); got != c.want {
				t.Errorf("got %s, want %s", got, c.want)
			}
		})
	}
}

func orEmpty(m map[string][]string) map[string][]string {
	if m == nil {
		return map[string][]string{}
	}
	return m
}

func TestTheConfigMapIsMergedOverTheFile(t *testing.T) {
	resolv := []string{"192.0.2.1:53"}
	file := forwarding{stubs: map[string][]string{"a.example": {"10.0.0.1"}, "B.example.": {"10.0.0.2"}}, upstreams: []string{"10.0.0.53"}}
	cases := []struct {
		name       string
		file, cm   forwarding
		wantStubs  string
		wantUpward string
	}{
		{"file alone", file, forwarding{}, "map[a.example.:[10.0.0.1] b.example.:[10.0.0.2]]", "[10.0.0.53]"},
		{"nothing: resolv.conf", forwarding{}, forwarding{}, "map[]", "[192.0.2.1:53]"},
		{"the ConfigMap wins per domain and adds its own",
			file, forwarding{stubs: map[string][]string{"b.example": {"10.9.9.2"}, "c.example": {"10.9.9.3"}}},
			"map[a.example.:[10.0.0.1] b.example.:[10.9.9.2] c.example.:[10.9.9.3]]", "[10.0.0.53]"},
		{"the ConfigMap's upstreams replace the file's", file, forwarding{upstreams: []string{"10.9.9.53"}},
			"map[a.example.:[10.0.0.1] b.example.:[10.0.0.2]]", "[10.9.9.53]"},
		{"the ConfigMap's upstreams replace resolv.conf's", forwarding{}, forwarding{upstreams: []string{"10.9.9.53"}}, "map[]", "[10.9.9.53]"},
	}
	for _, c := range cases {
		got := merge(c.file, c.cm, resolv)
		if s := fmt.Sprint(got.stubs); s != c.wantStubs {
			t.Errorf("%s: stubs %s, want %s", c.name, s, c.wantStubs)
		}
		if s := fmt.Sprint(got.upstreams); s != c.wantUpward {
			t.Errorf("%s: upstreams %s, want %s", c.name, s, c.wantUpward)
		}
	}
}

func TestChangedFieldsThatNeedARestart(t *testing.T) {
	running := v1alpha1.Default().DNS
	loaded := running
	loaded.StubDomains = map[string][]string{"corp.example": {"10.0.0.1"}}
	loaded.UpstreamServers = []string{"10.0.0.53"}
	if got := needRestart(running, loaded); len(got) != 0 {
		t.Errorf("forwarding changes need a restart: %v", got)
	}
	loaded.TTL = 30
	loaded.ServeStale.Duration = time.Minute
	if got, want := fmt.Sprint(needRestart(running, loaded)), "[dns.ttl dns.serveStale]"; got != want {
		t.Errorf("need a restart: %s, want %s", got, want)
	}
}

// A name's route costs one map lookup per label, however many stub
// domains there are, and nothing without any.
func BenchmarkRoute(b *testing.B) {
	for _, n := range []int{0, 10, 1000} {
		stubs := map[string][]string{}
		for i := range n {
			stubs[fmt.Sprintf("team%d.corp.example", i)] = []string{"10.0.0.1"}
		}
		r := newRoutes(forwarding{stubs: stubs, upstreams: []string{"192.0.2.53"}}, nil)
		b.Run(fmt.Sprintf("%d stub domains", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				r.route("api.v2.service.example.com.")
			}
		})
	}
}
