package lab

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
)

// Node is one node host: a namespace with its own containerd, a kubelet
// and netplane --role=node.
type Node struct {
	Name    string // the Kubernetes Node name
	Index   int
	NS      *netns.NS
	IP, IP6 string // underlay addresses, the Node's InternalIPs
	Dir     string // everything of this node under the state directory
	Socket  string // containerd's socket (CRI)
	CNIConf string // the CNI configuration directory netplane writes

	lab                 *Lab
	mu                  sync.Mutex
	containerd, kubelet *framework.Process
	// network is the node's network agent: netplane --role=node, or
	// kube-proxy in the upstream stack.
	network *framework.Process
}

// startNodes brings the nodes up side by side and waits until the control
// plane has given each one its pod CIDRs.
func (l *Lab) startNodes(ctx context.Context) error {
	// Before the first kubelet rewrites them.
	l.state.update(func(s *state) { s.HoldsSysctls = true })
	if err := holdSysctls(l.StateDir); err != nil {
		return err
	}
	errs := make(chan error, len(l.Nodes))
	for _, n := range l.Nodes {
		n.lab = l
		n.Dir = l.path("nodes", n.Name)
		n.Socket = filepath.Join(n.Dir, "containerd.sock")
		n.CNIConf = filepath.Join(n.Dir, "cni", "net.d")
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
	if err := n.startContainerd(ctx); err != nil {
		return fmt.Errorf("%s: %w", n.Name, err)
	}
	if !n.lab.upstream() {
		if err := n.StartNetplane(); err != nil {
			return fmt.Errorf("%s: %w", n.Name, err)
		}
	}
	if err := n.StartKubelet(); err != nil {
		return fmt.Errorf("%s: %w", n.Name, err)
	}
	return nil
}

// containerdConfig is the node's containerd configuration: its own root,
// state and sockets; CNI from this node's directories; the local pause
// image; restrict_oom_score_adj, without which runc fails on this kind of
// machine; network namespaces of pods under the state directory, so none
// lands in the machine's /run/netns.
const containerdConfig = `version = 2
root = "{{dir}}/root"
state = "{{dir}}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{{dir}}/containerd.sock"
[ttrpc]
  address = "{{dir}}/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{{dir}}/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{{pause}}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{{dir}}/cni/bin"
    conf_dir = "{{dir}}/cni/net.d"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
`

func (n *Node) startContainerd(ctx context.Context) error {
	for _, d := range []string{"root", "state", "opt", "cni/bin", "cni/net.d", "pods"} {
		if err := os.MkdirAll(filepath.Join(n.Dir, d), 0o755); err != nil {
			return err
		}
	}
	if err := copyFile(n.lab.bin.loopback, filepath.Join(n.Dir, "cni", "bin", "loopback")); err != nil {
		return err
	}
	conf := strings.NewReplacer("{{dir}}", n.Dir, "{{pause}}", PauseImage).Replace(containerdConfig)
	confPath := filepath.Join(n.Dir, "containerd.toml")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		return err
	}
	n.lab.state.addContainerd(containerdInfo{Namespace: n.NS.Name, Config: confPath, Socket: n.Socket, State: filepath.Join(n.Dir, "state")})
	p, err := n.lab.start(n.NS, n.Name+"-containerd", "containerd", "--config", confPath)
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

// StartNetplane starts netplane --role=node in the node; it installs the
// CNI plugin into the node's CNI bin dir and writes the conflist.
func (n *Node) StartNetplane() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	argv, env, err := n.nodeCommand()
	if err != nil {
		return err
	}
	p, err := n.lab.startEnv(n.NS, n.Name+"-netplane", env, argv...)
	n.network = p
	return err
}

// StopNetplane stops netplane --role=node.
func (n *Node) StopNetplane() {
	n.mu.Lock()
	p := n.network
	n.mu.Unlock()
	if p != nil {
		p.Stop(10 * time.Second)
	}
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
// does not start them again), then stops containerd and netplane.
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
	n.StopNetplane()
}

func copyFile(src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, data, 0o755)
}
