package lab

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
)

// Node is one node host: a network namespace and a mount namespace of its
// own (mounts.go), with its own containerd and kubelet. netplane's node
// role runs on it as the chart's DaemonSet pod.
type Node struct {
	Name    string // the Kubernetes Node name
	Index   int
	NS      *netns.NS
	IP, IP6 string // underlay addresses, the Node's InternalIPs
	Dir     string // everything of this node under the state directory
	// Socket is containerd's CRI socket and CNIConf the node's
	// /etc/cni/net.d, both as the machine's own mount namespace sees them.
	Socket, CNIConf string

	lab                 *Lab
	holder              int // the pid that holds the node's mount namespace
	mu                  sync.Mutex
	containerd, kubelet *framework.Process
	// network is the upstream stack's kube-proxy.
	network *framework.Process
}

// startNodes brings the nodes up side by side and waits until the control
// plane has given each one its pod CIDRs.
func (l *Lab) startNodes(ctx context.Context) error {
	// Before the first kubelet rewrites the kernel-wide settings, and
	// before the first node's mount namespace needs its mount points.
	l.state.update(func(s *state) { s.HoldsMachine = true })
	if err := holdMachine(l.StateDir); err != nil {
		return err
	}
	errs := make(chan error, len(l.Nodes))
	for _, n := range l.Nodes {
		n.lab = l
		n.Dir = l.path("nodes", n.Name)
		n.Socket = n.fsPath(containerdSocket)
		n.CNIConf = n.fsPath("/etc/cni/net.d")
		go func() { errs <- n.start(ctx) }()
	}
	for range l.Nodes {
		if err := <-errs; err != nil {
			return err
		}
	}
	cidrs := map[string][]string{}
	err := l.waitFor(60*time.Second, "pod CIDRs on every node", func(ctx context.Context) error {
		for _, n := range l.Nodes {
			node, err := l.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if len(node.Spec.PodCIDRs) == 0 {
				return fmt.Errorf("node %s has no pod CIDRs yet", n.Name)
			}
			cidrs[n.Name] = node.Spec.PodCIDRs
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, n := range l.Nodes {
		if err := l.routePodCIDRs(n, cidrs[n.Name]); err != nil {
			return err
		}
		if l.upstream() {
			if err := l.startUpstreamNodeNetwork(n, cidrs); err != nil {
				return err
			}
		}
	}
	return nil
}

func (n *Node) start(ctx context.Context) error {
	if err := os.MkdirAll(n.Dir, 0o755); err != nil {
		return err
	}
	if err := n.startMounts(); err != nil {
		return err
	}
	if err := n.startContainerd(ctx); err != nil {
		return fmt.Errorf("%s: %w", n.Name, err)
	}
	if err := n.StartKubelet(); err != nil {
		return fmt.Errorf("%s: %w", n.Name, err)
	}
	return nil
}

// containerdSocket is containerd's CRI socket inside a node.
const containerdSocket = "/run/containerd/containerd.sock"

// containerdConfig is the node's containerd configuration: the default
// paths, which are the node's own in its mount namespace; the local pause
// image; restrict_oom_score_adj, without which runc fails on this kind of
// machine; network namespaces of pods under the state folder, so none
// lands in the machine's /run/netns.
const containerdConfig = `version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "/run/containerd/containerd.sock"
[ttrpc]
  address = "/run/containerd/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "/var/lib/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{{pause}}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/opt/cni/bin"
    conf_dir = "/etc/cni/net.d"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
`

func (n *Node) startContainerd(ctx context.Context) error {
	if err := copyFile(n.lab.bin.loopback, n.fsPath("/opt/cni/bin/loopback")); err != nil {
		return err
	}
	conf := strings.NewReplacer("{{pause}}", PauseImage).Replace(containerdConfig)
	confPath := filepath.Join(n.Dir, "containerd.toml")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		return err
	}
	n.lab.state.addContainerd(containerdInfo{Namespace: n.NS.Name, Holder: n.holder, Config: confPath, Socket: n.Socket, State: n.fsPath("/run/containerd")})
	p, err := n.lab.startInCgroup(n.command("containerd", "--config", confPath), n.Name+"-containerd", n.containerdCgroup())
	if err != nil {
		return err
	}
	n.containerd = p
	client, err := DialCRI(n.Socket)
	if err != nil {
		return err
	}
	defer client.Close()
	if err := client.WaitReady(ctx, 30*time.Second); err != nil {
		return fmt.Errorf("%w\n%s", err, p.Tail(20))
	}
	for _, img := range n.lab.bin.images {
		out, err := exec.CommandContext(ctx, "ctr", "-a", n.Socket, "-n", "k8s.io", "images", "import", img).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ctr images import %s: %v: %s", img, err, out)
		}
	}
	return nil
}

// Logs returns the tails of the node's process logs, for failure messages.
func (n *Node) Logs(lines int) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var b strings.Builder
	for _, p := range []*framework.Process{n.kubelet, n.network, n.containerd} {
		if p != nil {
			fmt.Fprintf(&b, "--- %s ---\n%s\n", p.Name, p.Tail(lines))
		}
	}
	return b.String()
}

// stop removes the node's pods through containerd (kubelet first, so it
// does not start them again), then stops containerd and the upstream
// stack's kube-proxy.
func (n *Node) stop() {
	n.StopKubelet()
	if n.containerd != nil && !n.containerd.Exited() {
		if c, err := DialCRI(n.Socket); err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			c.RemoveAllSandboxes(ctx)
			cancel()
			c.Close()
		}
		n.containerd.Stop(10 * time.Second)
	}
	if n.network != nil {
		n.network.Stop(10 * time.Second)
	}
	// Its mount namespace goes with its holder, once nothing else runs in it.
	if n.holder != 0 {
		syscall.Kill(n.holder, syscall.SIGTERM)
	}
}

func copyFile(src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, data, 0o755)
}
