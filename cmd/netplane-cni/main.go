// Command netplane-cni is the CNI plugin containerd invokes for every pod
// sandbox. It stays lean (no Kubernetes client): its start-up time is part of
// every pod's network set-up latency.
package main

import (
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/netplane/netplane/cni/plugin"
)

func main() {
	skel.PluginMainFuncs(plugin.Funcs(), version.PluginSupports("0.4.0", "1.0.0", "1.1.0"),
		"netplane-cni: the netplane bridge/veth plugin")
}
