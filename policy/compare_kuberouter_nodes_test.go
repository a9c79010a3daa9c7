package policy

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
)

// vsTopology is one enforcer's two nodes and four probe pods, made fresh
// for each enforcer at each scale, so none inherits another's rules:
//
//	underlay (bridge br0) ── node-1 eth0 192.168.90.11 ── client pod (10.244.1.128/25), open client
//	                     └── node-2 eth0 192.168.90.12 ── server pod 10.244.2.130, open server
//
// Pods are routed, as ptp-style CNI plugins connect them: a veth whose
// node end has 169.254.1.1 (the pod's gateway) and a route to the pod's
// addresses, the node's route to the other node's pod CIDR through its
// address. Pod traffic between the nodes passes both nodes' forward hook,
// where both enforcers judge it.
type vsTopology struct {
	sw, node1, node2                *netns.NS
	client, server, openCl, openSrv *netns.NS
	streams                         chan vsStreamResult // from the servers' listeners
}

func newVSTopology(b *testing.B, label string) *vsTopology {
	t := &vsTopology{streams: make(chan vsStreamResult, 16)}
	t.sw = netns.New(b, label+"-sw")
	t.sw.Bridge(b, "br0")
	nodes := map[int]**netns.NS{vsClientNode: &t.node1, vsServerNode: &t.node2}
	for _, k := range []int{vsClientNode, vsServerNode} {
		up := "u-" + vsNodeName(k)
		n := netns.Host(b, fmt.Sprintf("%s-n%d", label, k), t.sw, up, "eth0")
		t.sw.Attach(b, up, "br0")
		n.Addr(b, "eth0", vsNodeIP(k)+"/24")
		n.Sysctl(b, "net.ipv4.ip_forward", "1")
		other := vsClientNode + vsServerNode - k
		n.Route(b, fmt.Sprintf("10.244.%d.0/24", other), "via", vsNodeIP(other))
		*nodes[k] = n
	}
	t.client = vsPodNS(b, label+"-client", t.node1, "v-client", vsClientRange, vsClientPodAddrs())
	t.openCl = vsPodNS(b, label+"-openc", t.node1, "v-openc", vsOpenClientIP+"/32", []string{vsOpenClientIP})
	t.server = vsPodNS(b, label+"-server", t.node2, "v-server", vsServerIP+"/32", []string{vsServerIP})
	t.openSrv = vsPodNS(b, label+"-opens", t.node2, "v-opens", vsOpenServerIP+"/32", []string{vsOpenServerIP})
	ports := []int{vsAllowedPort, vsGrantedPort, vsDeniedPort}
	for i := range vsMaxSamples {
		ports = append(ports, vsSamplePort0+i)
	}
	for _, p := range ports {
		t.listen(b, t.server, net.JoinHostPort(vsServerIP, strconv.Itoa(p)))
	}
	t.listen(b, t.openSrv, net.JoinHostPort(vsOpenServerIP, strconv.Itoa(vsAllowedPort)))
	return t
}

// vsClientPodAddrs are the client pod's address first, then those of the
// label and creation samples' pods.
func vsClientPodAddrs() []string {
	out := []string{vsClientIP}
	for i := range vsMaxSamples {
		out = append(out, vsLabelSampleIP(i), vsCreateSampleIP(i))
	}
	return out
}

// vsPodNS makes a pod namespace on node, routed through hostIf.
func vsPodNS(b *testing.B, label string, node *netns.NS, hostIf, routed string, addrs []string) *netns.NS {
	pod := netns.Host(b, label, node, hostIf, "eth0")
	node.MustExec(b, "ip", "addr", "add", "169.254.1.1/32", "dev", hostIf)
	node.MustExec(b, "ip", "route", "add", routed, "dev", hostIf, "scope", "link")
	for _, a := range addrs {
		pod.MustExec(b, "ip", "addr", "add", a+"/32", "dev", "eth0")
	}
	pod.MustExec(b, "ip", "route", "add", "169.254.1.1", "dev", "eth0", "scope", "link")
	pod.MustExec(b, "ip", "route", "add", "default", "via", "169.254.1.1", "dev", "eth0", "src", addrs[0])
	return pod
}

// vsStreamResult is what a server read from one connection that sent data.
type vsStreamResult struct {
	bytes       int64
	first, last time.Time
}

// listen accepts on addr in ns until the benchmark ends; every connection
// is read to its end, and one that carried data is reported on t.streams.
func (t *vsTopology) listen(b *testing.B, ns *netns.NS, addr string) {
	l, err := ns.Listen(addr)
	if err != nil {
		b.Fatal(err)
	}
	framework.Serve(b, l, func(c net.Conn) {
		buf := make([]byte, 256<<10)
		var r vsStreamResult
		for {
			n, err := c.Read(buf)
			if n > 0 {
				if r.bytes == 0 {
					r.first = time.Now()
				}
				r.bytes += int64(n)
				r.last = time.Now()
			}
			if err != nil {
				break
			}
		}
		if r.bytes > 0 {
			select {
			case t.streams <- r:
			default:
			}
		}
	})
}

// close deletes the namespaces, stopping what runs in them.
func (t *vsTopology) close(b *testing.B) {
	for _, ns := range []*netns.NS{t.client, t.openCl, t.server, t.openSrv, t.node1, t.node2, t.sw} {
		if err := ns.Delete(); err != nil {
			b.Error(err)
		}
	}
}

// vsEnforcer is one of the contenders: how it starts on a node, and the
// log lines that say when its caches had synced and when its first full
// sync of the policy rules was done. "none", the physical limit, starts
// nothing.
type vsEnforcer struct {
	name         string
	start        func(b *testing.B, node *netns.NS, k int, kubeconfig string) *framework.Process
	cachesSynced func(log string) time.Time
	fullSynced   func(log string) time.Time
	// failed, if set, finds a log line saying a sync failed.
	failed func(log string) string
	// busy, if set, reports from the log whether a sync is under way; an
	// enforcer whose log has been quiet for a while is idle either way.
	busy func(log string) bool
	// commitTable, if set, is the nftables table whose commits are timed
	// beside the prober.
	commitTable string
	samples     int // of each change kind
	// alternates: the enforcer takes a change of every policy fast enough
	// to be measured alternating between the scale and none
	// (vsMeasureAlternating); kube-router needs a minute for each.
	alternates bool
}

func (e vsEnforcer) enforces() bool { return e.start != nil }

var vsNone = vsEnforcer{name: "none"}

// vsNetplane runs netplane's node role as a node runs it: the Service
// proxy, the pod network (its bridge stays without ports here: the probe
// pods are routed) and the NetworkPolicy feature, table inet
// netplane-policy. --v=2 logs each sync of the policy table.
func vsNetplane(bin string, samples int) vsEnforcer {
	return vsEnforcer{
		name: "netplane", samples: samples, commitTable: TableName, alternates: true,
		start: func(b *testing.B, node *netns.NS, k int, kc string) *framework.Process {
			dir := b.TempDir()
			return node.Start(b, bin, "--role=node", "--v=2", "--kubeconfig="+kc, "--node-name="+vsNodeName(k),
				"--cluster-cidr=10.244.0.0/16", "--health-bind-address=127.0.0.1:0", "--metrics-bind-address=127.0.0.1:0",
				"--cni-conf-dir="+dir, "--cni-bin-dir="+dir, "--ipam-state-dir="+dir, "--bridge=np-bench0")
		},
		cachesSynced: func(log string) time.Time { return vsLogTime(log, `"caches synced"`, `network-policy`) },
		fullSynced:   func(log string) time.Time { return vsLogTime(log, `"synced"`, `type="full"`, `network-policy`) },
		failed: func(log string) string {
			data, _ := os.ReadFile(log)
			for _, line := range strings.Split(string(data), "\n") {
				if strings.Contains(line, "sync failed") && strings.Contains(line, "network-policy") {
					return line
				}
			}
			return ""
		},
	}
}

// vsKubeRouter runs kube-router's firewall alone: no routing, no service
// proxy. It finds its Node by --hostname-override, its local pods by
// status.hostIP equal to the Node's InternalIP, and programs iptables
// (Debian's iptables-nft, so rules land in nftables tables ip filter) and
// ipset. Each change requests a full sync, coalesced one deep. --v=1 logs
// each sync's duration, "sync iptables took".
func vsKubeRouter(bin string, samples int) vsEnforcer {
	return vsEnforcer{
		name: "kube-router", samples: samples,
		start: func(b *testing.B, node *netns.NS, k int, kc string) *framework.Process {
			return node.Start(b, bin, "--run-firewall=true", "--run-router=false", "--run-service-proxy=false",
				"--kubeconfig="+kc, "--hostname-override="+vsNodeName(k), "--service-cluster-ip-range=10.96.0.0/16",
				"--health-port=0", "--metrics-port=0", "--v=1")
		},
		// Logged when the informers have synced and the controller starts.
		cachesSynced: func(log string) time.Time { return vsLogTime(log, "Starting network policy controller") },
		fullSynced:   func(log string) time.Time { return vsLogTime(log, "sync iptables took") },
		// A sync logs nothing for most of its time: count starts and ends.
		busy: func(log string) bool {
			data, _ := os.ReadFile(log)
			return bytes.Count(data, []byte("Starting sync of iptables with version")) > bytes.Count(data, []byte("sync iptables took"))
		},
		failed: func(log string) string {
			data, _ := os.ReadFile(log)
			for _, line := range strings.Split(string(data), "\n") {
				if strings.Contains(line, "Aborting sync") {
					return line
				}
			}
			return ""
		},
	}
}

// vsStart starts e in node, the namespace of node k, with a kubeconfig
// whose server is a forwarder to the API server inside the namespace.
func vsStart(b *testing.B, e vsEnforcer, api *framework.APIServer, node *netns.NS, k int) *framework.Process {
	kc := filepath.Join(b.TempDir(), "kubeconfig")
	fwd := node.Forward(b, "127.0.0.1:0", strings.TrimPrefix(api.URL, "https://"))
	if err := api.WriteKubeconfig(kc, "https://"+fwd, api.Token); err != nil {
		b.Fatal(err)
	}
	return e.start(b, node, k, kc)
}

// vsLogTime is the time of the first klog line of path containing all of
// s; zero when there is none yet.
func vsLogTime(path string, s ...string) time.Time {
	f, err := os.Open(path)
	if err != nil {
		return time.Time{}
	}
	defer f.Close()
	data, err := io.ReadAll(f)
	if err != nil {
		return time.Time{}
	}
	for _, line := range strings.Split(string(data), "\n") {
		if len(line) < 21 || slices.ContainsFunc(s, func(sub string) bool { return !strings.Contains(line, sub) }) {
			continue
		}
		// I1125 20:58:00.123456 ...: klog's header has no year.
		t, err := time.ParseInLocation("0102 15:04:05.000000", line[1:21], time.Local)
		if err != nil {
			continue
		}
		return t.AddDate(time.Now().Year(), 0, 0)
	}
	return time.Time{}
}

// vsMemory is a process's resident memory, in KiB.
type vsMemory struct{ hwm, rss int }

func vsMemoryOf(p *framework.Process) vsMemory {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.Cmd.Process.Pid))
	if err != nil {
		return vsMemory{}
	}
	var m vsMemory
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "VmHWM:":
			m.hwm, _ = strconv.Atoi(f[1])
		case "VmRSS:":
			m.rss, _ = strconv.Atoi(f[1])
		}
	}
	return m
}
