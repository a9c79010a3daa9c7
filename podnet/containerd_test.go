package podnet

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/netplane/netplane/cni/ipam"
	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
)

// TestMain removes the binaries the tests built.
func TestMain(m *testing.M) { framework.Main(m) }

const pauseImage = "netplane.local/pause:test"

// TestContainerdRunsASandboxThroughNetplaneCNI is the real runtime path:
// containerd (started by the test in a node namespace, with its own root,
// state and socket) runs a pod sandbox through CRI, and its CRI plugin
// executes netplane-cni from the directory and with the conflist the node
// agent would install.
func TestContainerdRunsASandboxThroughNetplaneCNI(t *testing.T) {
	if testing.Short() {
		t.Skip("starts containerd")
	}
	framework.RequireRoot(t)
	containerd := framework.RequireBinary(t, "containerd")
	ctr := framework.RequireBinary(t, "ctr")
	framework.RequireBinary(t, "runc")
	framework.RequireBinary(t, "containerd-shim-runc-v2")
	plugin := filepath.Join(framework.NetplaneBinaries(t), "netplane-cni")

	dir := framework.TempDir(t, "npctrd")
	node := netns.New(t, "crinode")
	binDir, confDir, stateDir := filepath.Join(dir, "bin"), filepath.Join(dir, "net.d"), filepath.Join(dir, "ipam")
	if _, err := installPlugin(plugin, filepath.Join(binDir, "netplane-cni")); err != nil {
		t.Fatal(err)
	}
	writeLoopbackPlugin(t, binDir)
	conf := renderConflist(conflistOpts{PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.7.0/24")}, Bridge: "cni0", MTU: 1500, StateDir: stateDir})
	if _, err := writeAtomic(filepath.Join(confDir, ConflistName), conf, 0o644); err != nil {
		t.Fatal(err)
	}

	sock := filepath.Join(dir, "containerd.sock")
	cfg := filepath.Join(dir, "config.toml")
	os.WriteFile(cfg, []byte(containerdConfig(dir, sock, binDir, confDir)), 0o644)
	framework.RemoveNewCgroups(t, "k8s.io") // CRI's namespace, without a kubelet's cgroup parent
	proc := node.Start(t, containerd, "--config", cfg)
	client := dialCRI(t, sock, proc)
	importPause(t, ctr, sock, dir)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sandboxCfg := &cri.PodSandboxConfig{
		Metadata: &cri.PodSandboxMetadata{Name: "web", Uid: "uid-web", Namespace: "default"},
		Hostname: "web",
		Linux:    &cri.LinuxPodSandboxConfig{SecurityContext: &cri.LinuxSandboxSecurityContext{NamespaceOptions: &cri.NamespaceOption{}}},
	}
	run, err := client.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: sandboxCfg})
	if err != nil {
		t.Fatalf("RunPodSandbox: %v\ncontainerd log:\n%s", err, proc.Tail(30))
	}
	id := run.PodSandboxId
	removed := false
	t.Cleanup(func() {
		if !removed {
			c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			client.StopPodSandbox(c, &cri.StopPodSandboxRequest{PodSandboxId: id})
			client.RemovePodSandbox(c, &cri.RemovePodSandboxRequest{PodSandboxId: id})
		}
	})
	st, err := client.PodSandboxStatus(ctx, &cri.PodSandboxStatusRequest{PodSandboxId: id})
	if err != nil {
		t.Fatal(err)
	}
	ip := st.Status.GetNetwork().GetIp()
	if ip != "10.244.7.2" {
		t.Fatalf("sandbox IP %q, want 10.244.7.2 from netplane-cni", ip)
	}
	store := &ipam.Store{Dir: stateDir, BootID: bootID(t)}
	if s, err := store.Read(); err != nil || len(s.Attachments) != 1 || s.Attachments[0].ContainerID != id || s.Attachments[0].IfName != "eth0" {
		t.Fatalf("IPAM after RunPodSandbox: %+v %v", s, err)
	}
	node.MustExec(t, "ping", "-c1", "-W2", ip) // the node reaches the sandbox over the bridge

	if _, err := client.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
		t.Fatal(err)
	}
	removed = true
	if s, err := store.Read(); err != nil || len(s.Attachments) != 0 {
		t.Fatalf("IPAM after RemovePodSandbox: %+v %v", s, err)
	}
	framework.EventuallyEvery(t, 100*time.Millisecond, 15*time.Second, "no veth left after the sandbox was removed", func() error {
		if out := node.MustExec(t, "ip", "-o", "link", "show", "type", "veth"); strings.TrimSpace(out) != "" {
			return fmt.Errorf("veths:\n%s", out)
		}
		return nil
	})
}

func bootID(t *testing.T) string {
	b, err := os.ReadFile(ipam.BootIDPath)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func containerdConfig(dir, sock, binDir, confDir string) string {
	return fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = %q
[ttrpc]
  address = %q
[debug]
  level = "info"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q
    max_conf_num = 1
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), sock, sock+".ttrpc", pauseImage, binDir, confDir)
}

// writeLoopbackPlugin puts a minimal `loopback` plugin beside ours:
// containerd 1.6 always attaches one, and the reference plugins are not
// part of this test.
func writeLoopbackPlugin(t *testing.T, binDir string) {
	t.Helper()
	script := `#!/bin/sh
case "$CNI_COMMAND" in
ADD) nsenter --net="$CNI_NETNS" ip link set lo up || exit 1
     echo '{"cniVersion":"0.3.1","interfaces":[{"name":"lo","sandbox":"'"$CNI_NETNS"'"}]}' ;;
VERSION) echo '{"cniVersion":"0.3.1","supportedVersions":["0.3.0","0.3.1"]}' ;;
esac
exit 0
`
	if err := os.WriteFile(filepath.Join(binDir, "loopback"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
}

func dialCRI(t *testing.T, sock string, proc *framework.Process) cri.RuntimeServiceClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	client := cri.NewRuntimeServiceClient(conn)
	framework.EventuallyEvery(t, 200*time.Millisecond, 30*time.Second, "containerd's CRI ready", func() error {
		if proc.Exited() {
			t.Fatalf("containerd exited:\n%s", proc.Tail(30))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		st, err := client.Status(ctx, &cri.StatusRequest{})
		if err == nil && !runtimeReady(st) {
			err = fmt.Errorf("status %v", st)
		}
		return err
	})
	return client
}

func runtimeReady(st *cri.StatusResponse) bool {
	for _, c := range st.GetStatus().GetConditions() {
		if c.Type == cri.RuntimeReady && c.Status {
			return true
		}
	}
	return false
}

// importPause builds a static pause binary into a docker-archive image and
// imports it: no registry is needed.
func importPause(t *testing.T, ctr, sock, dir string) {
	t.Helper()
	src := filepath.Join(dir, "pause-src")
	os.MkdirAll(src, 0o755)
	os.WriteFile(filepath.Join(src, "go.mod"), []byte("module pause\n\ngo 1.22\n"), 0o644)
	os.WriteFile(filepath.Join(src, "main.go"), []byte(`package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGTERM, syscall.SIGINT)
	<-c
}
`), 0o644)
	bin := filepath.Join(dir, "pause")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir = src
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=", "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build pause: %v\n%s", err, out)
	}
	body, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(dir, "pause.tar")
	if err := framework.WriteImageArchive(archive, pauseImage, []string{"/pause"}, []framework.File{{Path: "pause", Data: body}}); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(ctr, "-a", sock, "-n", "k8s.io", "images", "import", archive).CombinedOutput(); err != nil {
		t.Fatalf("ctr import: %v\n%s", err, out)
	}
}
