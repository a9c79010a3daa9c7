package lab

import (
	"context"
	"net"
	"path/filepath"
	"strconv"
)

// Roles replaces the lab's own way of running netplane, so a test can prove a
// deployment method (the Helm chart) in the lab: each role runs with the
// arguments, environment and credentials the method gives it.
type Roles struct {
	Controller, Node RoleCommand
	// DNSDeployed says the hook created the cluster DNS itself (a Deployment
	// of netplane --role=dns pods and the kube-dns Service at DNSServiceIP);
	// the lab then creates neither.
	DNSDeployed bool
}

// RoleCommand is how one role process starts. The lab adds --kubeconfig (a
// kubeconfig carrying Token) and, for the node role, what differs per lab
// node: $NETPLANE_NODE_NAME (as a DaemonSet's downward API sets it) and the
// CNI and IPAM folders under the node's own directory.
type RoleCommand struct {
	Args  []string // after the binary
	Env   []string // added to the lab's environment
	Token string   // a bearer token, e.g. from the TokenRequest API
}

// RolesHook is called once the API server answers, before any netplane role
// or node starts; it may create objects and returns how to run the roles.
type RolesHook func(ctx context.Context, l *Lab) (*Roles, error)

// apiServerURL is the API server's address as hosts in the lab reach it.
func apiServerURL() string {
	return "https://" + net.JoinHostPort(ControlPlaneIP, strconv.Itoa(APIPort))
}

// controllerCommand is the argv and environment of netplane --role=controller.
func (l *Lab) controllerCommand() ([]string, []string, error) {
	if l.roles == nil {
		return []string{l.bin.netplane, "--role=controller",
			"--kubeconfig=" + l.kubeconfigFor("netplane-controller"),
			"--health-bind-address=127.0.0.1:10270", "--metrics-bind-address=127.0.0.1:10271", "--v=2"}, nil, nil
	}
	kubeconfig := l.path("kubeconfigs", "hook-controller.kubeconfig")
	if err := l.writeKubeconfig(kubeconfig, apiServerURL(), l.roles.Controller.Token); err != nil {
		return nil, nil, err
	}
	argv := append([]string{l.bin.netplane}, l.roles.Controller.Args...)
	return append(argv, "--kubeconfig="+kubeconfig), l.roles.Controller.Env, nil
}

// nodeCommand is the argv and environment of netplane --role=node on n.
func (n *Node) nodeCommand() ([]string, []string, error) {
	l := n.lab
	paths := []string{"--cni-conf-dir=" + n.CNIConf, "--cni-bin-dir=" + filepath.Join(n.Dir, "cni", "bin"),
		"--cni-plugin-path=" + l.bin.netplaneCNI, "--ipam-state-dir=" + filepath.Join(n.Dir, "ipam")}
	if l.Config.Encryption == "wireguard" {
		paths = append(paths, "--encryption=wireguard", "--wireguard-implementation=userspace",
			"--wireguard-private-key-file="+filepath.Join(n.Dir, "wireguard", "private.key"))
	}
	if l.roles == nil {
		argv := []string{l.bin.netplane, "--role=node", "--node-name=" + n.Name,
			"--kubeconfig=" + l.kubeconfigFor("netplane-node"), "--cluster-cidr=" + ClusterCIDRs, "--service-cidrs=" + ServiceCIDRs}
		argv = append(argv, paths...)
		return append(argv, "--health-bind-address=0.0.0.0:10290", "--metrics-bind-address=127.0.0.1:10249", "--v=2"), nil, nil
	}
	kubeconfig := filepath.Join(n.Dir, "hook-node.kubeconfig")
	if err := l.writeKubeconfig(kubeconfig, apiServerURL(), l.roles.Node.Token); err != nil {
		return nil, nil, err
	}
	argv := append([]string{l.bin.netplane}, l.roles.Node.Args...)
	argv = append(argv, "--kubeconfig="+kubeconfig)
	// The node's namespace has its own /proc/sys/net: it stands in for the
	// host's, which a DaemonSet pod mounts elsewhere.
	argv = append(argv, append(paths, "--proc-sys-dir=/proc/sys")...)
	// What a DaemonSet's downward API gives each pod.
	env := append([]string{"NETPLANE_NODE_NAME=" + n.Name}, l.roles.Node.Env...)
	return argv, env, nil
}
