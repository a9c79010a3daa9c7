package lab

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/netplane/netplane/e2e/framework"
)

// kubeletConfig is a node's KubeletConfiguration. This machine has cgroup
// v1 (hybrid) and no systemd as PID 1, hence cgroupfs and failCgroupV1
// false; each node has its own cgroup root, since kubelets that share one
// delete each other's pods. Image garbage collection is off: there is no
// registry to pull an image from again. Eviction thresholds are low so a
// busy disk does not evict the lab's pods. Pods with dnsPolicy Default get
// the lab's upstream DNS server, never the machine's resolver. The API
// server reaches the kubelet with its client certificate from the lab CA;
// the kubelet asks the API server whether a request is allowed, as in
// kubeadm's clusters.
const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
cgroupRoot: {{cgroupRoot}}
cgroupsPerQOS: true
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://{{socket}}
podLogsDir: /var/log/pods
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: "1%"
  nodefs.inodesFree: "1%"
  imagefs.available: "1%"
  imagefs.inodesFree: "1%"
clusterDNS: [{{clusterDNS}}]
clusterDomain: {{clusterDomain}}
resolvConf: {{dir}}/resolv.conf
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
serializeImagePulls: false
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: {{ca}}
authorization:
  mode: Webhook
`

// kubeletDir holds the kubelet's certificates and configuration; its root
// folder is the node's /var/lib/kubelet.
func (n *Node) kubeletDir(elem ...string) string {
	return filepath.Join(append([]string{n.Dir, "kubelet"}, elem...)...)
}

// cgroupRoot is the node's own cgroup, unique on the machine: the node's
// namespace name holds the pid of the process that made the lab.
func (n *Node) cgroupRoot() string { return "/" + n.NS.Name }

// StartKubelet starts the node's kubelet inside the node.
func (n *Node) StartKubelet() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	l := n.lab
	if err := os.MkdirAll(n.kubeletDir("pki"), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(n.kubeletDir("resolv.conf"), []byte("nameserver "+l.Config.UpstreamDNS()+"\n"), 0o644); err != nil {
		return err
	}
	conf := strings.NewReplacer("{{cgroupRoot}}", n.cgroupRoot(), "{{socket}}", containerdSocket, "{{dir}}", n.kubeletDir(),
		"{{clusterDNS}}", l.Config.DNSServiceIP(), "{{clusterDomain}}", ClusterDomain, "{{ca}}", l.pki.CA).Replace(kubeletConfig)
	if err := os.WriteFile(n.kubeletDir("config.yaml"), []byte(conf), 0o644); err != nil {
		return err
	}
	l.state.addCgroupRoot(n.cgroupRoot())
	if err := makeCgroup(n.cgroupRoot()); err != nil {
		return err
	}
	p, err := l.startCmd(n.command(framework.Binary("kubelet"),
		"--config="+n.kubeletDir("config.yaml"), "--kubeconfig="+l.kubeconfigFor("system:node:"+n.Name),
		"--root-dir=/var/lib/kubelet", "--cert-dir="+n.kubeletDir("pki"),
		"--hostname-override="+n.Name, "--node-ip="+l.Config.NodeIPs(n), "--node-labels="+n.topologyLabels(), "--v=1"), n.Name+"-kubelet")
	n.kubelet = p
	return err
}

// StopKubelet stops the kubelet; its pods keep running, and a kubelet
// started again takes them over.
func (n *Node) StopKubelet() {
	n.mu.Lock()
	p := n.kubelet
	n.mu.Unlock()
	if p != nil {
		p.Stop(10 * time.Second)
	}
}

// makeCgroup creates path in every cgroup v1 hierarchy (and the unified
// one of a hybrid machine): the kubelet checks that its cgroup root exists
// in each. A new cpuset cgroup has no CPUs or memory nodes until given its
// parent's.
func makeCgroup(path string) error {
	for _, h := range cgroupHierarchies() {
		dir := filepath.Join(h, path)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("cgroup %s: %w", dir, err)
		}
		if filepath.Base(h) != "cpuset" {
			continue
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			v, err := os.ReadFile(filepath.Join(filepath.Dir(dir), f))
			if err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(dir, f), v, 0o644); err != nil {
				return fmt.Errorf("cgroup %s/%s: %w", dir, f, err)
			}
		}
	}
	return nil
}

// containerdCgroup is the cgroup of the node's containerd and of every shim
// it starts, beside the kubelet's cgroup root.
func (n *Node) containerdCgroup() string { return n.cgroupRoot() + "-containerd" }

// startInCgroup is startCmd in a cgroup of its own, recorded first, which
// Down empties and removes. It is how containerd runs: its shims leave it
// (a double fork to pid 1) but keep its cgroup, so Down finds them there
// by their own pids, also after containerd died. nsenter execs the command
// in its own pid, which is moved before it makes any child it keeps
// (containerd starts no shim before the kubelet asks for a pod).
func (l *Lab) startInCgroup(cmd *exec.Cmd, name, cgroup string) (*framework.Process, error) {
	l.state.addCgroupRoot(cgroup)
	if err := makeCgroup(cgroup); err != nil {
		return nil, err
	}
	p, err := l.startCmd(cmd, name)
	if err != nil {
		return nil, err
	}
	if err := joinCgroup(cgroup, p.Cmd.Process.Pid); err != nil {
		p.Kill()
		return nil, err
	}
	return p, nil
}

// joinCgroup moves pid into path (made by makeCgroup) in every hierarchy;
// the children it makes afterwards are born there.
func joinCgroup(path string, pid int) error {
	for _, h := range cgroupHierarchies() {
		procs := filepath.Join(h, path, "cgroup.procs")
		if err := os.WriteFile(procs, []byte(strconv.Itoa(pid)), 0o644); err != nil {
			return fmt.Errorf("move pid %d into %s: %w", pid, procs, err)
		}
	}
	return nil
}

// cgroupHierarchies are the mounted cgroup hierarchies under /sys/fs/cgroup.
func cgroupHierarchies() []string {
	entries, _ := os.ReadDir("/sys/fs/cgroup")
	var out []string
	for _, e := range entries {
		dir := filepath.Join("/sys/fs/cgroup", e.Name())
		if _, err := os.Stat(filepath.Join(dir, "cgroup.procs")); err == nil {
			out = append(out, dir)
		}
	}
	return out
}

// removeCgroup removes path from every hierarchy, deepest first. What still
// runs in it is the lab's (pods of a node whose kubelet and containerd are
// gone): it is killed first.
func removeCgroup(path string) error {
	var errs []string
	for _, h := range cgroupHierarchies() {
		root := filepath.Join(h, path)
		var dirs []string
		filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := rmdirCgroup(dirs[i]); err != nil {
				errs = append(errs, err.Error())
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("remove cgroup %s: %s", path, strings.Join(errs, "; "))
	}
	return nil
}

// rmdirCgroup kills the processes of one cgroup and removes it once they
// are gone.
func rmdirCgroup(dir string) error {
	return framework.Poll(context.Background(), 50*time.Millisecond, 10*time.Second, "cgroup "+dir+" removed", func(context.Context) error {
		err := os.Remove(dir)
		if err == nil || os.IsNotExist(err) {
			return nil
		}
		procs, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		for _, f := range strings.Fields(string(procs)) {
			var pid int
			if _, err := fmt.Sscan(f, &pid); err == nil && pid > 1 {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		return err
	})
}

// Region and zone labels: every node of the lab is in region "lab" and in
// one of three zones, zone-a, zone-b and zone-c in turn, as a cloud
// region's nodes are: three nodes have a zone each, six have two per zone
// (what upstream's Traffic Distribution tests ask for).
const Region = "lab"

// Zone is the zone of the node with index i.
func Zone(i int) string { return "zone-" + string(rune('a'+i%3)) }

func (n *Node) topologyLabels() string {
	return corev1.LabelTopologyRegion + "=" + Region + "," + corev1.LabelTopologyZone + "=" + Zone(n.Index)
}
