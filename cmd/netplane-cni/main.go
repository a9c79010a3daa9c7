// Command netplane-cni is the CNI plugin containerd invokes for every pod
// sandbox. It stays lean (no Kubernetes client): its start-up time is part of
// every pod's network set-up latency.
package main

import (
	"os"
	"runtime"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/netplane/netplane/cni/plugin"
)

// One P: the plugin is one goroutine making one syscall after another, and
// a second P only brings a thread that spins looking for work to steal.
// When many pods start at once, dozens of plugin processes share the node's
// CPUs, and that spinning was 12-20% of each one's CPU time (measured with
// 50 concurrent ADDs and DELs on 2 cores).
func init() { runtime.GOMAXPROCS(1) }

func main() {
	if len(os.Args) > 1 && os.Args[1] == plugin.DeleteLinkCommand {
		os.Exit(plugin.DeleteLinkMain(os.Args[2:]))
	}
	skel.PluginMainFuncs(plugin.Funcs(), version.PluginSupports("0.4.0", "1.0.0", "1.1.0"),
		"netplane-cni: the netplane bridge/veth plugin")
}
