package outage

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
)

// place is where a server of a netplane process listens: the machine's
// loopback (ns nil) or a test namespace's.
type place struct {
	ns   *netns.NS
	addr string
}

func (p place) dial(network string) (net.Conn, error) {
	if p.ns == nil {
		return net.Dial(network, p.addr)
	}
	return p.ns.Dial(network, p.addr)
}

func (p place) get(path string) (int, string, error) {
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DialContext: func(_ context.Context, network, _ string) (net.Conn, error) { return p.dial(network) },
	}}
	return framework.HTTPGet(client, "http://"+p.addr+path)
}

// roles is the three roles running one way: as three processes or as one.
type roles struct {
	node    string    // the Node the node role runs as
	nodeNS  *netns.NS // where it programs its rules
	dns     place
	health  []place
	metrics []place
	procs   []*framework.Process
}

// services counts the Services made, for unique names and pod addresses.
var services int

// roleArgs are the flags every process gets: free loopback ports and
// nothing that reaches outside the test; the controller runs without
// leader election (TestControllerLosingItsLease has it on).
func roleArgs(dir string) []string {
	return []string{
		"--health-bind-address=127.0.0.1:0", "--metrics-bind-address=127.0.0.1:0",
		"--dns-bind-address=127.0.0.1:0", "--upstream-servers=127.0.0.1:1", "--leader-elect=false",
		"--cni-conf-dir=" + filepath.Join(dir, "net.d"), "--cni-bin-dir=" + filepath.Join(dir, "cni-bin"),
		"--ipam-state-dir=" + filepath.Join(dir, "ipam"), "--v=2",
	}
}

func nodeArgs(bin, node string) []string {
	return []string{"--node-name=" + node, "--cluster-cidr=10.244.0.0/16", "--cni-plugin-path=" + filepath.Join(bin, "netplane-cni")}
}

// startSeparate runs the controller and the DNS on the machine's loopback
// and the node role in a namespace of its own, each its own process.
func startSeparate(t *testing.T, node string) *roles {
	bin := framework.NetplaneBinaries(t)
	r := &roles{node: node, nodeNS: netns.New(t, "outage-node")}
	for _, role := range []string{"controller", "dns"} {
		dir := t.TempDir()
		cmd := exec.Command(filepath.Join(bin, "netplane"), append([]string{"--role=" + role, "--kubeconfig=" + api.Kubeconfig}, roleArgs(dir)...)...)
		p, err := framework.StartProcess("netplane-"+role, cmd, filepath.Join(dir, "netplane.log"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Stop(5 * time.Second) })
		r.add(t, p, nil, role == "dns")
	}
	r.add(t, startInNamespace(t, r.nodeNS, bin, "node", nodeArgs(bin, node)), r.nodeNS, false)
	return r
}

// startTogether runs the three roles in one process, in a namespace.
func startTogether(t *testing.T, node string) *roles {
	bin := framework.NetplaneBinaries(t)
	r := &roles{node: node, nodeNS: netns.New(t, "outage-all")}
	r.add(t, startInNamespace(t, r.nodeNS, bin, "controller,dns,node", nodeArgs(bin, node)), r.nodeNS, true)
	return r
}

// startInNamespace starts netplane in ns, reaching the API server through
// a forwarder there.
func startInNamespace(t *testing.T, ns *netns.NS, bin, roles string, extra []string) *framework.Process {
	fwd := ns.Forward(t, "127.0.0.1:0", strings.TrimPrefix(api.URL, "https://"))
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := api.WriteKubeconfig(kubeconfig, "https://"+fwd, api.Token); err != nil {
		t.Fatal(err)
	}
	args := append(append([]string{"--role=" + roles, "--kubeconfig=" + kubeconfig}, extra...), roleArgs(dir)...)
	p, err := ns.StartCmd(ns.Command(filepath.Join(bin, "netplane"), args...), filepath.Join(dir, "netplane.log"))
	if err != nil {
		t.Fatal(err)
	}
	// Stopped before dir is removed: the namespace stops what runs in it
	// only after, and a node role's last sync could still be installing
	// the CNI plugin into dir.
	t.Cleanup(func() { p.Stop(5 * time.Second) })
	p.Name = "netplane-" + roles
	return p
}

var servingDNS = regexp.MustCompile(`"serving DNS".* address="([^"]+)"`)

// add waits until p serves and is ready, and notes where it listens.
func (r *roles) add(t *testing.T, p *framework.Process, ns *netns.NS, dnsRole bool) {
	t.Helper()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s log tail:\n%s", p.Name, p.Tail(40))
		}
	})
	health, metrics := framework.ServedAddresses(t, p, 30*time.Second)
	r.procs = append(r.procs, p)
	r.health = append(r.health, place{ns, health})
	r.metrics = append(r.metrics, place{ns, metrics})
	framework.Eventually(t, 60*time.Second, p.Name+" /readyz is 200", func() error {
		code, body, err := place{ns, health}.get("/readyz")
		if err != nil || code != http.StatusOK {
			return fmt.Errorf("%d %s %v", code, body, err)
		}
		return nil
	})
	if dnsRole {
		data, _ := os.ReadFile(p.Log)
		m := servingDNS.FindSubmatch(data)
		if m == nil {
			t.Fatalf("%s logged no DNS address:\n%s", p.Name, p.Tail(30))
		}
		r.dns = place{ns, string(m[1])}
	}
}

// lookup asks the DNS role for name's A records.
func (r *roles) lookup(name string) ([]string, error) {
	c, err := r.dns.dial("udp")
	if err != nil {
		return nil, err
	}
	conn := &dns.Conn{Conn: c}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(500 * time.Millisecond))
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), dns.TypeA)
	if err := conn.WriteMsg(q); err != nil {
		return nil, err
	}
	a, err := conn.ReadMsg()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, rr := range a.Answer {
		if rec, ok := rr.(*dns.A); ok {
			out = append(out, rec.A.String())
		}
	}
	return out, nil
}

// rules is the node role's nftables table.
func (r *roles) rules() string {
	out, _ := r.nodeNS.Exec("nft", "list", "table", "ip", "netplane")
	return out
}

// requests sums, over the processes, the requests client-go sent (failed
// ones too) and the readiness probes among them; by counts them by method
// and result, to tell where a budget went.
func (r *roles) requests(t *testing.T) (requests, probes int, by map[string]int) {
	t.Helper()
	by = map[string]int{}
	for _, m := range r.metrics {
		code, body, err := m.get("/metrics")
		if err != nil || code != http.StatusOK {
			t.Fatalf("metrics of %s: %d %v", m.addr, code, err)
		}
		requests += sumMetric(body, "rest_client_requests_total", by)
		probes += sumMetric(body, "netplane_apiserver_probes_total", nil)
	}
	return requests, probes, by
}

var methodAndCode = regexp.MustCompile(`(?:code|method)="([^"]*)"`)

// sumMetric sums the samples of name; by, if not nil, gets them by their
// code and method labels.
func sumMetric(body, name string, by map[string]int) int {
	total := 0.0
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, name+" ") && !strings.HasPrefix(line, name+"{") {
			continue
		}
		f := strings.Fields(line)
		v, _ := strconv.ParseFloat(f[len(f)-1], 64)
		total += v
		if by != nil {
			var key []string
			for _, m := range methodAndCode.FindAllStringSubmatch(line, -1) {
				key = append(key, m[1])
			}
			by[strings.Join(key, " ")] += int(v)
		}
	}
	return int(total)
}

// grew lists what grew from before to after, largest first.
func grew(before, after map[string]int) string {
	var out []string
	for k, v := range after {
		if d := v - before[k]; d > 0 {
			out = append(out, fmt.Sprintf("%d %s", d, k))
		}
	}
	slices.SortFunc(out, func(a, b string) int {
		x, _ := strconv.Atoi(strings.Fields(a)[0])
		y, _ := strconv.Atoi(strings.Fields(b)[0])
		return y - x
	})
	return strings.Join(out, ", ")
}

// ready checks every process still answers /readyz 200: an outage does not
// make a synced role unready.
func (r *roles) ready(t *testing.T) {
	t.Helper()
	for i, h := range r.health {
		if code, body, err := h.get("/readyz"); err != nil || code != http.StatusOK {
			t.Errorf("%s /readyz during the outage: %d %q %v, want 200", r.procs[i].Name, code, body, err)
		}
	}
}
