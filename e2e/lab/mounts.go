package lab

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// nodePaths are the folders that are a node's own on a real node and that
// its daemons and pods' hostPath volumes name: the chart's DaemonSet
// mounts the CNI folders and netplane's state folder; containerd and the
// kubelet keep their roots, state and logs in the rest. In the lab each is
// a bind mount, inside the node's own mount namespace, of a folder under
// the node's directory, as the paths of a kind node are its container's.
var nodePaths = []string{
	"/etc/cni/net.d",
	"/opt/cni/bin",
	"/var/lib/cni",
	"/var/lib/kubelet",
	"/var/lib/containerd",
	"/run/containerd",
	"/var/log/pods",
	"/var/log/containers",
	"/var/lib/netplane",
}

// fsPath is where a node path's content lives, as the machine's own mount
// namespace sees it.
func (n *Node) fsPath(p string) string { return filepath.Join(n.Dir, "fs", p) }

// holderScript makes the bind mounts in the new mount namespace, says so on
// stdout, and then blocks: the holder keeps the namespace for nsenter, and
// its command line names the state directory, which Down checks before it
// kills a recorded pid.
const holderScript = `set -e
while [ $# -gt 1 ]; do mount --bind "$1" "$2"; shift 2; done
echo ready
exec tail -f "$1"`

// startMounts starts the node's mount-namespace holder in the node's
// network namespace. The namespace is a slave of the machine's: the node
// sees the machine's mounts (the state directory among them), and nothing
// mounted in it (the bind mounts, the kubelet's volumes, containerd's
// rootfs and pod network namespaces) reaches the machine's namespace.
// Everything mounted in it goes away with its last process.
func (n *Node) startMounts() error {
	args := []string{"--net=" + n.NS.Path, "--", "unshare", "--mount", "--propagation", "slave", "--", "sh", "-c", holderScript, "holder"}
	for _, p := range nodePaths {
		if err := os.MkdirAll(n.fsPath(p), 0o755); err != nil {
			return err
		}
		args = append(args, n.fsPath(p), p)
	}
	mark := filepath.Join(n.Dir, "mounts")
	if err := os.WriteFile(mark, nil, 0o644); err != nil {
		return err
	}
	args = append(args, mark)
	cmd := exec.Command("nsenter", args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	logf, err := os.Create(n.lab.path("logs", n.Name+"-mounts.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		return err
	}
	go cmd.Wait()
	n.holder = cmd.Process.Pid
	n.lab.state.addPid(n.Name+"-mounts", n.holder)
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(out).ReadString('\n')
		if err == nil && strings.TrimSpace(line) != "ready" {
			err = fmt.Errorf("holder said %q", line)
		}
		ready <- err
	}()
	select {
	case err = <-ready:
	case <-time.After(10 * time.Second):
		err = fmt.Errorf("not ready after 10s")
	}
	if err != nil {
		log, _ := os.ReadFile(logf.Name())
		return fmt.Errorf("%s: mount namespace: %v: %s", n.Name, err, log)
	}
	return nil
}

// command runs name inside the node: its network and mount namespaces.
func (n *Node) command(name string, args ...string) *exec.Cmd {
	return exec.Command("nsenter", append([]string{"--target=" + strconv.Itoa(n.holder), "--net", "--mount", "--", name}, args...)...)
}
