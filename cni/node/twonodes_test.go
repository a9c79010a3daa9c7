package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netplane/netplane/cni/nft"
	"github.com/netplane/netplane/cni/node"
	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
)

// labNode is a node namespace on the underlay running `netplane --role=node`.
type labNode struct {
	name, ip string
	ns       *netns.NS
	dir      string
	proc     *framework.Process
}

func (n *labNode) confDir() string { return filepath.Join(n.dir, "net.d") }
func (n *labNode) binDir() string  { return filepath.Join(n.dir, "bin") }

// startNode makes node `name` (1, 2, ...) at 192.168.77.1<i> and
// fd00:77::1<i> with pod CIDRs 10.244.<i>.0/24 and fd00:10:244:<i>::/64.
// Its uplink has MTU 1450, which pods must inherit.
func startNode(t *testing.T, s *framework.APIServer, sw *netns.NS, i int) *labNode {
	t.Helper()
	name, ip, ip6 := fmt.Sprintf("node%d", i), fmt.Sprintf("192.168.77.1%d", i), fmt.Sprintf("fd00:77::1%d", i)
	n := &labNode{name: name, ip: ip, dir: t.TempDir()}
	n.ns = netns.Host(t, name, sw, "u-"+name, "eth0")
	sw.Attach(t, "u-"+name, "br0")
	n.ns.MustExec(t, "ip", "link", "set", "eth0", "mtu", "1450")
	n.ns.Addr(t, "eth0", ip+"/24")
	n.ns.Addr(t, "eth0", ip6+"/64")
	// A default route through the "outside" host, as a real node has one.
	n.ns.Route(t, "default", "via", "192.168.77.100")

	ctx := framework.Ctx(t)
	cidrs := []string{fmt.Sprintf("10.244.%d.0/24", i), fmt.Sprintf("fd00:10:244:%d::/64", i)}
	obj := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.NodeSpec{PodCIDR: cidrs[0], PodCIDRs: cidrs}}
	created, err := s.Client.CoreV1().Nodes().Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	created.Status.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: ip}, {Type: v1.NodeInternalIP, Address: ip6}}
	if _, err := s.Client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	fwd := n.ns.Forward(t, "127.0.0.1:0", strings.TrimPrefix(s.URL, "https://"))
	kubeconfig := filepath.Join(n.dir, "kubeconfig")
	if err := s.WriteKubeconfig(kubeconfig, "https://"+fwd, s.Token); err != nil {
		t.Fatal(err)
	}
	// No --cni-plugin-path: the agent installs the netplane-cni beside it.
	bins := framework.NetplaneBinaries(t)
	n.proc = n.ns.Start(t, filepath.Join(bins, "netplane"),
		"--role=node", "--kubeconfig="+kubeconfig, "--node-name="+name,
		"--cni-conf-dir="+n.confDir(), "--cni-bin-dir="+n.binDir(),
		"--ipam-state-dir="+filepath.Join(n.dir, "ipam"),
		"--cluster-cidr=10.244.0.0/16,fd00:10:244::/48", "--sync-period=2s", "--min-sync-period=100ms",
		"--health-bind-address=127.0.0.1:0", "--metrics-bind-address=127.0.0.1:0")
	return n
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// addPod makes a pod namespace on n through the conflist and plugin the
// agent installed, as a runtime would; it returns the IPv4 and IPv6 address.
func (n *labNode) addPod(t *testing.T, id string) (*netns.NS, string, string) {
	t.Helper()
	pod := netns.New(t, "pod")
	list, err := libcni.ConfListFromFile(filepath.Join(n.confDir(), node.ConflistName))
	if err != nil {
		t.Fatal(err)
	}
	cni := libcni.NewCNIConfigWithCacheDir([]string{n.binDir()}, filepath.Join(n.dir, "cache"), nil)
	rt := &libcni.RuntimeConf{ContainerID: id, NetNS: pod.Path, IfName: "eth0"}
	var res *current.Result
	err = n.ns.Do(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		raw, err := cni.AddNetworkList(ctx, list, rt)
		if err != nil {
			return err
		}
		res, err = current.NewResultFromResult(raw)
		return err
	})
	if err != nil {
		t.Fatalf("ADD %s on %s: %v", id, n.name, err)
	}
	if len(res.IPs) != 2 {
		t.Fatalf("pod %s got %v, want an address per family", id, res.IPs)
	}
	if out := pod.MustExec(t, "ip", "link", "show", "eth0"); !strings.Contains(out, "mtu 1450") {
		t.Fatalf("pod eth0 does not have the uplink's MTU 1450:\n%s", out)
	}
	return pod, res.IPs[0].Address.IP.String(), "[" + res.IPs[1].Address.IP.String() + "]"
}

// whoami answers every TCP connection on port in ns with the caller's address.
func whoami(t *testing.T, ns *netns.NS, addr string) {
	t.Helper()
	l, err := ns.Listen(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
			io.WriteString(c, host)
			c.Close()
		}
	}()
}

func askWho(ns *netns.NS, addr string) (string, error) {
	var got string
	err := ns.Do(func() error {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(time.Second))
		b, err := io.ReadAll(c)
		got = string(b)
		return err
	})
	return got, err
}

func expectWho(t *testing.T, from *netns.NS, addr, want string) {
	t.Helper()
	waitFor(t, fmt.Sprintf("connect to %s from %s", addr, from.Name), 30*time.Second, func() error {
		got, err := askWho(from, addr)
		if err != nil {
			return err
		}
		if got != want {
			return fmt.Errorf("server saw the client as %s, want %s", got, want)
		}
		return nil
	})
}

func TestTwoNodesRoutePodsToEachOtherAndMasqueradeEgress(t *testing.T) {
	framework.RequireRoot(t)
	s := framework.StartAPIServer(t, framework.Options{})
	sw := netns.New(t, "underlay")
	sw.Bridge(t, "br0")
	ext := netns.Host(t, "ext", sw, "u-ext", "eth0")
	sw.Attach(t, "u-ext", "br0")
	ext.Addr(t, "eth0", "192.168.77.100/24")
	ext.Addr(t, "eth0", "fd00:77::100/64")

	n1 := startNode(t, s, sw, 1)
	n2 := startNode(t, s, sw, 2)
	// A node whose address is only reachable through a gateway.
	far := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "far"}, Spec: v1.NodeSpec{PodCIDRs: []string{"10.244.3.0/24"}}}
	ctx := framework.Ctx(t)
	far, err := s.Client.CoreV1().Nodes().Create(ctx, far, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	far.Status.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "10.99.0.5"}}
	if _, err := s.Client.CoreV1().Nodes().UpdateStatus(ctx, far, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	for _, n := range []*labNode{n1, n2} {
		waitFor(t, "conflist and plugin on "+n.name, 60*time.Second, func() error {
			if n.proc.Exited() {
				t.Fatalf("netplane on %s exited:\n%s", n.name, n.proc.Tail(30))
			}
			b, err := os.ReadFile(filepath.Join(n.confDir(), node.ConflistName))
			if err != nil {
				return err
			}
			var doc map[string]any
			if err := json.Unmarshal(b, &doc); err != nil {
				return fmt.Errorf("conflist is not JSON: %v", err)
			}
			_, err = os.Stat(filepath.Join(n.binDir(), "netplane-cni"))
			return err
		})
	}
	waitFor(t, "route on node1 to node2's pods", 30*time.Second, func() error {
		out, _ := n1.ns.Exec("ip", "route", "show", "10.244.2.0/24")
		if !strings.Contains(out, "via 192.168.77.12") {
			return fmt.Errorf("routes: %q", out)
		}
		return nil
	})

	podA, ipA, ip6A := n1.addPod(t, "pod-a")
	podB, ipB, ip6B := n2.addPod(t, "pod-b")
	whoami(t, podB, ":8080")
	whoami(t, n2.ns, "192.168.77.12:8081")
	whoami(t, ext, ":8082")
	whoami(t, podA, ":8080")

	t.Run("pod to pod across nodes keeps the pod address", func(t *testing.T) {
		expectWho(t, podA, ipB+":8080", ipA)
		expectWho(t, podB, ipA+":8080", ipB)
		expectWho(t, podA, ip6B+":8080", strings.Trim(ip6A, "[]"))
	})
	t.Run("pod to the other node", func(t *testing.T) {
		expectWho(t, podA, "192.168.77.12:8081", "192.168.77.11")
	})
	t.Run("pod egress leaving the cluster CIDR is masqueraded", func(t *testing.T) {
		expectWho(t, podA, "192.168.77.100:8082", "192.168.77.11")
		expectWho(t, podB, "192.168.77.100:8082", "192.168.77.12")
		expectWho(t, podA, "[fd00:77::100]:8082", "fd00:77::11")
	})
	t.Run("a deleted route is restored", func(t *testing.T) {
		n1.ns.MustExec(t, "ip", "route", "del", "10.244.2.0/24")
		expectWho(t, podA, ipB+":8080", ipA)
	})
	t.Run("a deleted masquerade table is restored", func(t *testing.T) {
		if err := n1.ns.Do(func() error { return nft.Replace(node.MasqTable, nil) }); err != nil {
			t.Fatal(err)
		}
		expectWho(t, podA, "192.168.77.100:8082", "192.168.77.11")
	})
	t.Run("a node off the L2 segment is reported, not routed", func(t *testing.T) {
		if out, _ := n1.ns.Exec("ip", "route", "show", "10.244.3.0/24"); strings.TrimSpace(out) != "" {
			t.Fatalf("route to the far node's pods: %s", out)
		}
		waitFor(t, "PodCIDRNotRoutable event", 30*time.Second, func() error {
			evs, err := s.Client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "reason=PodCIDRNotRoutable"})
			if err != nil {
				return err
			}
			for _, e := range evs.Items {
				if e.InvolvedObject.Name == "far" {
					return nil
				}
			}
			return fmt.Errorf("%d events, none about node far", len(evs.Items))
		})
	})
	t.Run("a deleted node's routes go", func(t *testing.T) {
		if err := s.Client.CoreV1().Nodes().Delete(ctx, "node2", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "route to node2's pods removed", 30*time.Second, func() error {
			if out, _ := n1.ns.Exec("ip", "route", "show", "10.244.2.0/24"); strings.TrimSpace(out) != "" {
				return fmt.Errorf("still there: %s", out)
			}
			return nil
		})
	})
}
