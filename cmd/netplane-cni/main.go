// Command netplane-cni is the CNI plugin containerd invokes for every pod
// sandbox. It stays lean (no Kubernetes client): its start-up time is part of
// every pod's network set-up latency.
package main

import (
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
)

func main() {
	skel.PluginMainFuncs(skel.CNIFuncs{
		Add:    notYet,
		Del:    notYet,
		Check:  notYet,
		Status: func(*skel.CmdArgs) error { return notYet(nil) },
		GC:     func(*skel.CmdArgs) error { return notYet(nil) },
	}, version.PluginSupports("0.4.0", "1.0.0", "1.1.0"), "netplane-cni: the netplane bridge/veth plugin")
}

func notYet(*skel.CmdArgs) error {
	return types.NewError(types.ErrInvalidNetworkConfig, "netplane-cni does not set up pod networks yet", "only VERSION is implemented in this build")
}
