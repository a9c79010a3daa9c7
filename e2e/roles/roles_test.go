// Package roles tests the netplane process as an operator runs it: each role
// started against the real API server becomes ready once its caches synced,
// serves metrics, and stops cleanly on SIGTERM.
package roles

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
)

var api *framework.APIServer

func TestMain(m *testing.M) { framework.RunWithAPIServer(m, framework.Options{}, &api) }

// roleArgs are the flags every test process gets: free loopback ports and
// nothing that reaches outside the test.
func roleArgs(dir string) []string {
	return []string{
		"--health-bind-address=127.0.0.1:0", "--metrics-bind-address=127.0.0.1:0",
		"--dns-bind-address=127.0.0.1:0", "--upstream-servers=127.0.0.1:1",
		"--cni-conf-dir=" + filepath.Join(dir, "net.d"), "--cni-bin-dir=" + filepath.Join(dir, "cni-bin"),
		"--ipam-state-dir=" + filepath.Join(dir, "ipam"), "--v=2",
	}
}

func TestEachRoleBecomesReadyServesMetricsAndStopsOnSIGTERM(t *testing.T) {
	bin := framework.NetplaneBinaries(t)
	for _, roles := range []string{"controller", "dns", "controller,dns"} {
		t.Run(roles, func(t *testing.T) {
			dir := t.TempDir()
			cmd := exec.Command(filepath.Join(bin, "netplane"), append([]string{"--role=" + roles, "--kubeconfig=" + api.Kubeconfig}, roleArgs(dir)...)...)
			p, err := framework.StartProcess("netplane", cmd, filepath.Join(dir, "netplane.log"))
			if err != nil {
				t.Fatal(err)
			}
			defer p.Stop(5 * time.Second)
			checkServesAndStops(t, p, http.DefaultClient, strings.Split(roles, ","))
		})
	}
}

// The node role programs the node's network, so it only ever runs inside a
// namespace the test made; it reaches the loopback API server through a
// forwarder inside that namespace.
func TestNodeRoleInANamespace(t *testing.T) {
	bin := framework.NetplaneBinaries(t)
	ctx := framework.Ctx(t)
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "roles-test-node"}, Spec: corev1.NodeSpec{PodCIDR: "10.244.7.0/24", PodCIDRs: []string{"10.244.7.0/24"}}}
	if _, err := api.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer api.Client.CoreV1().Nodes().Delete(context.Background(), node.Name, metav1.DeleteOptions{})

	ns := netns.New(t, "node")
	fwd := ns.Forward(t, "127.0.0.1:0", strings.TrimPrefix(api.URL, "https://"))
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := api.WriteKubeconfig(kubeconfig, "https://"+fwd, api.Token); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"--role=node", "--kubeconfig=" + kubeconfig, "--node-name=" + node.Name,
		"--cluster-cidr=10.244.0.0/16", "--cni-plugin-path=" + filepath.Join(bin, "netplane-cni")}, roleArgs(dir)...)
	p, err := ns.StartCmd(ns.Command(filepath.Join(bin, "netplane"), args...), filepath.Join(dir, "netplane.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop(5 * time.Second)
	// The servers listen on the namespace's loopback: dial them from inside it.
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DialContext: func(_ context.Context, network, addr string) (net.Conn, error) { return ns.Dial(network, addr) },
	}}
	checkServesAndStops(t, p, client, []string{"node"})
}

func checkServesAndStops(t *testing.T, p *framework.Process, client *http.Client, roles []string) {
	t.Helper()
	health, metrics := framework.ServedAddresses(t, p, 30*time.Second)
	framework.Eventually(t, 60*time.Second, "/readyz is 200", func() error {
		code, body, err := framework.HTTPGet(client, "http://"+health+"/readyz")
		if err != nil || code != http.StatusOK {
			return fmt.Errorf("%d %s %v", code, body, err)
		}
		return nil
	})
	if code, body, err := framework.HTTPGet(client, "http://"+health+"/healthz"); err != nil || code != http.StatusOK {
		t.Errorf("/healthz: %d %q %v", code, body, err)
	}
	code, body, err := framework.HTTPGet(client, "http://"+metrics+"/metrics")
	if err != nil || code != http.StatusOK || !strings.Contains(body, "go_goroutines") || !strings.Contains(body, "process_resident_memory_bytes") {
		t.Errorf("/metrics: %d %v, body starts %.200q", code, err, body)
	}
	if err := p.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err, exited := p.Wait(15 * time.Second)
	if !exited {
		t.Fatalf("%v did not stop within 15s of SIGTERM:\n%s", roles, p.Tail(20))
	}
	if err != nil {
		t.Fatalf("%v exited with %v after SIGTERM:\n%s", roles, err, p.Tail(20))
	}
	t.Logf("%v ready, served metrics, and stopped %v after SIGTERM", roles, time.Since(start).Round(time.Millisecond))
}

// Until its caches have synced a role is alive but not ready: here the API
// server is behind a gate that holds every connection until it opens.
func TestReadyzIsFalseUntilCachesSynced(t *testing.T) {
	bin := framework.NetplaneBinaries(t)
	gate := make(chan struct{})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stop := netns.Relay(l, func() (net.Conn, error) {
		<-gate
		return net.Dial("tcp", strings.TrimPrefix(api.URL, "https://"))
	})
	opened := false
	defer func() {
		if !opened {
			close(gate)
		}
		stop()
	}()
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := api.WriteKubeconfig(kubeconfig, "https://"+l.Addr().String(), api.Token); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(bin, "netplane"), append([]string{"--role=dns", "--kubeconfig=" + kubeconfig}, roleArgs(dir)...)...)
	p, err := framework.StartProcess("netplane", cmd, filepath.Join(dir, "netplane.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop(5 * time.Second)
	health, _ := framework.ServedAddresses(t, p, 30*time.Second)
	for i := 0; i < 10; i++ {
		code, body, err := framework.HTTPGet(http.DefaultClient, "http://"+health+"/readyz")
		if err != nil || code != http.StatusServiceUnavailable || !strings.Contains(body, "dns") {
			t.Fatalf("before sync /readyz = %d %q %v, want 503 naming the dns role", code, body, err)
		}
		if code, _, _ := framework.HTTPGet(http.DefaultClient, "http://"+health+"/healthz"); code != http.StatusOK {
			t.Fatalf("before sync /healthz = %d, want 200: a role waiting for the API server is alive", code)
		}
		time.Sleep(50 * time.Millisecond)
	}
	close(gate)
	opened = true
	framework.Eventually(t, 60*time.Second, "/readyz is 200 after the API server is reachable", func() error {
		code, body, _ := framework.HTTPGet(http.DefaultClient, "http://"+health+"/readyz")
		if code != http.StatusOK {
			return errors.New(body)
		}
		return nil
	})
}
