package lab

import (
	"fmt"
	"path/filepath"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/netplane/netplane/e2e/netns"
)

// recordRunning writes what Attach needs once the lab is up.
func (l *Lab) recordRunning() {
	l.state.update(func(s *state) {
		s.Kubeconfig, s.APIAddress, s.External, s.BinDir = l.Kubeconfig, l.APIAddress, l.External.Name, l.bin.dir
		s.Underlay, s.Subnets, s.Encryption, s.PodRelay = l.Underlay.Name, l.Config.Subnets, l.Config.Encryption, l.Config.PodRelay
		s.Family, s.Stack = l.Config.Family, l.Config.Stack
		s.Nodes = nil
		for _, n := range l.Nodes {
			s.Nodes = append(s.Nodes, nodeInfo{Name: n.Name, Namespace: n.NS.Name, Socket: n.Socket, IP: n.IP, IP6: n.IP6})
		}
	})
}

// Attach gives another process (the lab CLI's exec and check commands) a
// handle on a running lab to inspect and use it; it cannot stop it (Down does).
func Attach(stateDir string) (*Lab, error) {
	stateDir, _ = filepath.Abs(stateDir)
	st, err := readState(stateDir)
	if err != nil {
		return nil, fmt.Errorf("no lab in %s: %w", stateDir, err)
	}
	if st.Kubeconfig == "" {
		return nil, fmt.Errorf("the lab in %s is not up (yet)", stateDir)
	}
	l := &Lab{Config: Config{StateDir: stateDir, Nodes: len(st.Nodes), Subnets: max(st.Subnets, 1), Encryption: st.Encryption,
		PodRelay: st.PodRelay, Family: st.Family, Stack: st.Stack, Log: func(string, ...any) {}},
		Kubeconfig: st.Kubeconfig, APIAddress: st.APIAddress, closed: true}
	l.bin = binaries{dir: st.BinDir, testimage: filepath.Join(st.BinDir, "testimage")}
	l.External = nsByName(st.External)
	if st.Underlay != "" {
		l.Underlay = nsByName(st.Underlay)
	}
	for i, n := range st.Nodes {
		l.Nodes = append(l.Nodes, &Node{Name: n.Name, Index: i, NS: nsByName(n.Namespace), IP: n.IP, IP6: n.IP6, Socket: n.Socket, lab: l})
	}
	if l.RestConfig, err = clientcmd.BuildConfigFromFlags("", l.Kubeconfig); err != nil {
		return nil, err
	}
	// The examples use externalIPs on purpose; the API server's deprecation
	// warning about them would only clutter the demo's check lines.
	l.RestConfig.WarningHandler = rest.NoWarnings{}
	l.Client, err = kubernetes.NewForConfig(l.RestConfig)
	return l, err
}

func nsByName(name string) *netns.NS {
	return &netns.NS{Name: name, Path: filepath.Join("/run/netns", name)}
}
