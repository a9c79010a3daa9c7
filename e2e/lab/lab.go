// Package lab is netplane's end-to-end lab: a whole Kubernetes cluster on one
// machine, every host of it a network namespace. It is test infrastructure,
// not part of the product. It brings up
//
//   - an underlay: a bridge in its own namespace that every host plugs into
//     (subnet A, 172.30.0.0/24 and fd00:172:30::/64), except every second
//     node, which plugs into a second bridge (subnet B, 172.30.2.0/24 and
//     fd00:172:30:2::/64); the underlay namespace routes between the two
//     subnets as a router that knows nothing of pod CIDRs, so pods reach
//     the nodes of the other subnet only through the VXLAN overlay. With
//     Subnets 1 every host is on subnet A;
//   - a control-plane host running etcd, kube-apiserver, kube-controller-manager
//     (node IPAM on, its EndpointSlice controllers off) and kube-scheduler;
//   - N node hosts, each a network and a mount namespace of its own (the
//     node's own /etc/cni/net.d, /var/lib/kubelet, ...) with its own
//     containerd and the real kubelet (built from the pinned
//     k8s.io/kubernetes module, in its own cgroup root);
//   - netplane installed by `helm install` of charts/netplane, as a user
//     installs it: the node role as the DaemonSet, the controller and the
//     DNS as Deployments;
//   - an external client host and a fake upstream DNS server host;
//   - a relay in the root namespace on 127.0.0.1 to the API server, the one
//     way in from outside (a listening socket, no route or interface).
//
// Nothing is configured in the machine's root network namespace, and
// nothing is mounted in its mount namespace. Everything made is recorded in
// a state directory first, so Down can remove it after a crash of the
// process that made it.
package lab

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
)

// Addresses of the lab's fixed hosts on the underlay and of its cluster.
const (
	UnderlayGateway4 = "172.30.0.1"
	UnderlayGateway6 = "fd00:172:30::1"
	ControlPlaneIP   = "172.30.0.2"
	ControlPlaneIP6  = "fd00:172:30::2"
	ControlPlaneIPB  = "172.30.2.2" // its leg on subnet B
	ControlPlaneIP6B = "fd00:172:30:2::2"
	UpstreamDNSIP    = "172.30.0.53"
	ExternalIP       = "172.30.0.100"
	ExternalIP6      = "fd00:172:30::100"
	APIPort          = 6443
	DNSServiceIP     = "10.96.0.10"
	ClusterDomain    = "cluster.local"
)

// Subnet B of a lab with two subnets: its gateway, the underlay
// namespace's address on it.
const (
	SubnetBGateway4 = "172.30.2.1"
	SubnetBGateway6 = "fd00:172:30:2::1"
)

// subnet is one underlay subnet: the bridge its hosts plug into and the
// underlay namespace's address on it, every host's default gateway.
type subnet struct {
	bridge, net4, net6, gw4, gw6 string
}

var subnets = []subnet{
	{bridge: underlayBridge, net4: "172.30.0.", net6: "fd00:172:30::", gw4: UnderlayGateway4, gw6: UnderlayGateway6},
	{bridge: underlayBridge + "-b", net4: "172.30.2.", net6: "fd00:172:30:2::", gw4: SubnetBGateway4, gw6: SubnetBGateway6},
}

// nodeSubnet is the subnet of node i (0-based): with two subnets, every
// second node is on subnet B.
func (c Config) nodeSubnet(i int) subnet { return subnets[i%c.Subnets] }

// nodeAddrs are the underlay addresses of node i (0-based).
func (c Config) nodeAddrs(i int) (ip4, ip6 string) {
	s := c.nodeSubnet(i)
	return fmt.Sprintf("%s%d", s.net4, 11+i), fmt.Sprintf("%s%d", s.net6, 11+i)
}

// Config says what lab to build.
type Config struct {
	// Nodes is the number of node hosts; default 2.
	Nodes int
	// Subnets is the number of underlay subnets the nodes are spread over,
	// 1 or 2; default $NETPLANE_LAB_SUBNETS, else 2. Two subnets cost the
	// demo no measurable time (three runs each on a 2-core machine under
	// load: 61, 81, 89 s with one; 71, 73, 99 s with two) and put the
	// overlay's tunnel on the path of every scenario across nodes.
	Subnets int
	// StateDir holds everything the lab writes; it must not hold a lab
	// already (Down removes a leftover one).
	StateDir string
	// APIListen is the root-namespace address of the relay to the API
	// server; default 127.0.0.1:0 (a free port).
	APIListen string
	// Log receives one line per step; nil discards.
	Log func(format string, args ...any)
	// Stack is StackNetplane (the default) or StackUpstream (see stack.go);
	// default $NETPLANE_LAB_STACK.
	Stack string
	// Encryption is the chart's encryption.mode: none or wireguard (in
	// process: the lab's nodes share one kernel, which has no WireGuard
	// module), reached from a lab without encryption by the two-step
	// rollout of the chart's README; default $NETPLANE_LAB_ENCRYPTION,
	// else none.
	Encryption string
	// PodRelay runs the chart's pod relays (relay.enabled), from which the
	// node agents read pods; default $NETPLANE_LAB_POD_RELAY=1.
	PodRelay bool
	// Family is the cluster's address family: FamilyDual (the default),
	// FamilyIPv4 or FamilyIPv6 (family.go); default $NETPLANE_LAB_IP_FAMILY.
	Family string
}

// Lab is a running lab.
type Lab struct {
	Config
	Underlay, ControlPlane, External, Upstream *netns.NS
	Nodes                                      []*Node
	// Kubeconfig is an admin kubeconfig that reaches the API server through
	// the relay on APIAddress, for kubectl in the root namespace.
	Kubeconfig string
	APIAddress string
	Client     kubernetes.Interface
	RestConfig *rest.Config
	// BuildTime is how long compiling the binaries took, which a test's
	// time budget for the lab itself leaves out.
	BuildTime time.Duration
	// Bootstrap is each node's Ready condition before netplane was
	// installed, as its kubelet reported it.
	Bootstrap map[string]string

	bin       binaries
	pki       pki
	cp        *controlPlane
	state     *stateFile
	stopRelay func()
	mu        sync.Mutex
	closed    bool
}

// Start builds the lab. On error everything made so far is removed.
func Start(ctx context.Context, cfg Config) (l *Lab, err error) {
	tools, err := cfg.complete()
	if err != nil {
		return nil, err
	}
	if err := cfg.preflight(tools); err != nil {
		return nil, err
	}
	l = &Lab{Config: cfg, state: newStateFile(cfg.StateDir)}
	defer func() {
		if err != nil {
			l.Close()
			l = nil
		}
	}()
	steps := []struct {
		name string
		fn   func(context.Context) error
	}{
		{"binaries and images", l.buildBinaries},
		{"underlay and hosts", l.buildTopology},
		{"control plane", l.startControlPlane},
		{"nodes", l.startNodes},
		{"netplane", l.deployNetwork},
		{"cluster DNS", l.deployDNS},
		{"encryption", l.rollEncryptionIn},
	}
	for _, s := range steps {
		start := time.Now()
		if err := s.fn(ctx); err != nil {
			return l, fmt.Errorf("lab %s: %w", s.name, err)
		}
		if s.name == "binaries and images" {
			l.BuildTime = time.Since(start)
		}
		cfg.Log("lab: %s ready (%.1fs)", s.name, time.Since(start).Seconds())
	}
	l.recordRunning()
	return l, nil
}

// complete fills in what c leaves unset (from NETPLANE_LAB_* where the
// demo takes it), checks what it names, and returns the tools the lab
// needs for its stack.
func (c *Config) complete() (tools []string, err error) {
	if c.Nodes == 0 {
		c.Nodes = 2
	}
	if c.Stack == "" {
		c.Stack = os.Getenv("NETPLANE_LAB_STACK")
	}
	if c.Subnets == 0 {
		c.Subnets, _ = strconv.Atoi(os.Getenv("NETPLANE_LAB_SUBNETS"))
	}
	if c.Encryption == "" {
		c.Encryption = os.Getenv("NETPLANE_LAB_ENCRYPTION")
	}
	if !c.PodRelay {
		c.PodRelay = os.Getenv("NETPLANE_LAB_POD_RELAY") == "1"
	}
	if err := c.completeFamily(); err != nil {
		return nil, err
	}
	tools = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "containerd", "ctr", "runc", "nsenter", "unshare", "ip", "helm"}
	switch c.Stack {
	case "", StackNetplane:
		c.Stack = StackNetplane
	case StackUpstream:
		// Pods of other nodes are reached by host-gw routes, on one subnet.
		if c.Subnets == 0 {
			c.Subnets = 1
		}
		if c.Subnets != 1 {
			return nil, fmt.Errorf("the upstream stack routes pod CIDRs host-gw, on one subnet, not %d (NETPLANE_LAB_SUBNETS)", c.Subnets)
		}
		tools = append(tools, upstreamTools...)
	default:
		return nil, fmt.Errorf("unknown stack %q (NETPLANE_LAB_STACK): %s or %s", c.Stack, StackNetplane, StackUpstream)
	}
	switch c.Encryption {
	case "", "none", "wireguard":
	default:
		return nil, fmt.Errorf("unknown encryption %q (NETPLANE_LAB_ENCRYPTION): none or wireguard", c.Encryption)
	}
	switch c.Subnets {
	case 0:
		c.Subnets = 2
	case 1, 2:
	default:
		return nil, fmt.Errorf("the lab spreads its nodes over 1 or 2 subnets, not %d (NETPLANE_LAB_SUBNETS)", c.Subnets)
	}
	if c.APIListen == "" {
		c.APIListen = "127.0.0.1:0"
	}
	if c.Log == nil {
		c.Log = func(string, ...any) {}
	}
	return tools, nil
}

// preflight checks that no lab is recorded in the state directory and
// that every tool is there, and makes the directory.
func (c *Config) preflight(tools []string) error {
	c.StateDir, _ = filepath.Abs(c.StateDir)
	if _, err := os.Stat(filepath.Join(c.StateDir, stateName)); err == nil {
		return fmt.Errorf("a lab is recorded in %s: run `netplane-lab down --state-dir=%s` (or `make demo-down`) first", c.StateDir, c.StateDir)
	}
	for _, tool := range tools {
		if framework.Binary(tool) == "" {
			return fmt.Errorf("%s not found in %s or on $PATH: run `make tools` (and `make anchors` for the upstream stack) as root", tool, framework.BinDir())
		}
	}
	return os.MkdirAll(c.StateDir, 0o755)
}

// Close stops everything in order (kubelets first, so none recreates a pod,
// then each node's pods through CRI, containerd, the control plane) and then
// removes whatever is still recorded in the state directory.
func (l *Lab) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	l.mu.Unlock()
	for _, n := range l.Nodes {
		n.stop()
	}
	if l.cp != nil {
		l.cp.stop()
	}
	if l.stopRelay != nil {
		l.stopRelay()
	}
	return Down(l.StateDir, l.Log)
}

// path is a file in the state directory.
func (l *Lab) path(elem ...string) string {
	return filepath.Join(append([]string{l.StateDir}, elem...)...)
}

// start runs a command inside ns with its log in the state directory and
// records its pid so Down finds it after a crash.
func (l *Lab) start(ns *netns.NS, name string, argv ...string) (*framework.Process, error) {
	return l.startEnv(ns, name, nil, argv...)
}

// startEnv is start with variables added to the environment.
func (l *Lab) startEnv(ns *netns.NS, name string, env []string, argv ...string) (*framework.Process, error) {
	cmd := ns.Command(argv[0], argv[1:]...)
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	return l.startCmd(cmd, name)
}

// startCmd starts cmd with its log in the state directory and records its
// pid.
func (l *Lab) startCmd(cmd *exec.Cmd, name string) (*framework.Process, error) {
	p, err := framework.StartProcess(name, cmd, l.path("logs", name+".log"))
	if err != nil {
		return nil, err
	}
	l.state.addPid(name, p.Cmd.Process.Pid)
	return p, nil
}
