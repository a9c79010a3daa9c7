// Package node is netplane's node role: one agent per node that runs the
// node's features side by side, each owning its own nftables table or
// links, as kindnet composes its agents:
//
//	proxy    Services: table ip/ip6 netplane
//	podnet   the pod network: bridge, forwarding and bridge-netfilter
//	         sysctls, CNI configuration and plugin, egress masquerade
//	         (table inet netplane-pods)
//	overlay  routes to other nodes' pods (protocol 207), the VXLAN devices
//	         netplane.vxlan and netplane.vxlan6 and their entries
//	policy   NetworkPolicy for this node's pods: table inet netplane-policy
//	wireguard  with --encryption=wireguard, the device netplane.wg, its
//	         peers, the routes into it (protocol 208) and the guard table
//	         inet netplane-wg; the overlay then steps aside (its Off)
//
// Each feature is built the same way, New(role.Deps, nodeview.Settings)
// (*Feature, error), when the process builds its roles: that is when it
// registers its metrics (Deps.Register) and the informer views it reads
// (before any informer starts); it writes events through Deps.Recorder,
// and then runs until the process stops. Each runs in the same shell,
// nodeview.Loop: the feature is a sync function from its views to the
// kernel, and the loop owns when it runs, its /healthz and /readyz checks
// (named after the feature), the log of its failures and waits, and the
// sync metrics netplane_node_sync_*{feature}. The node's settings (dataplane,
// the cluster's pod CIDRs, the MTU) are read from the configuration once,
// here, and handed to every feature. What the features share (the Node
// view, the address family, the settings) is in package nodeview, the
// netlink helpers in
// package link: no feature imports another. When one fails, the others are
// stopped too and the role fails. A stop leaves every table, route and link
// in place, so the node keeps forwarding while the agent is restarted;
// Cleanup (netplane --role=node --cleanup) removes them, each feature its
// own.
package node

import (
	"context"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/internal/handover"
	"github.com/netplane/netplane/internal/informer"
	"github.com/netplane/netplane/internal/memory"
	"github.com/netplane/netplane/internal/podrelay"
	"github.com/netplane/netplane/internal/role"
	"github.com/netplane/netplane/nodeview"
	"github.com/netplane/netplane/overlay"
	"github.com/netplane/netplane/podnet"
	"github.com/netplane/netplane/policy"
	"github.com/netplane/netplane/proxy"
	"github.com/netplane/netplane/wireguard"
)

// Feature is one part of the node role.
type Feature interface {
	// Run programs the node until ctx ends (nil) or it fails.
	Run(ctx context.Context) error
}

// constructor is how the role builds a feature.
type constructor func(role.Deps, nodeview.Settings) (Feature, error)

// construct adapts a feature's constructor.
func construct[F Feature](newF func(role.Deps, nodeview.Settings) (F, error)) constructor {
	return func(d role.Deps, s nodeview.Settings) (Feature, error) { return newF(d, s) }
}

// features builds the node's features in the order they start, each with
// the settings read here.
func features(d role.Deps) ([]Feature, error) {
	s := nodeview.SettingsOf(d.Config.Node)
	d.Log.Info("node settings", "dataplane", s.Dataplane(), "clusterCIDRs", clusterCIDRs(s), "mtu", mtu(s))
	var out []Feature
	for _, build := range []constructor{
		construct(proxy.New),
		construct(podnet.New),
		construct(overlay.New),
		// NetworkPolicy reads none of the settings.
		func(d role.Deps, _ nodeview.Settings) (Feature, error) { return policy.New(d) },
		construct(wireguard.New),
	} {
		f, err := build(d, s)
		if err != nil {
			return nil, err
		}
		out = append(out, f)
	}
	return out, nil
}

// clusterCIDRs and mtu say where settings come from, for the log.
func clusterCIDRs(s nodeview.Settings) any {
	if s.ClusterCIDRsFromNodes() {
		return "every Node's pod CIDRs (no --cluster-cidr)"
	}
	return s.ClusterCIDRs(nil)
}

func mtu(s nodeview.Settings) any {
	if s.MTU == 0 {
		return "the underlay's less the dataplane's overhead"
	}
	return s.MTU
}

// servingGCPercent is the node role's GOGC once every feature's first sync
// has converged (the proxy's 50 before, for a fast start), unless $GOGC is
// set. What it holds then is nearly all long-lived (at 150,000 pods and
// 10,000 NetworkPolicies about 150 MB of pod records, policy sets and
// Service records) and serving makes little garbage (0.08 CPUs at 100 pod
// changes a second), while at 50 the heap grows half as large again as
// what is live before each collection (docs/scale.md).
const servingGCPercent = 25

// Role is the node role as the process builds it: one part, on every node.
// With --agent-socket it takes the node over from an agent running there
// and hands it to the next (handover.go).
func Role(d role.Deps) []role.Runnable {
	gate := dialRunning(d)
	if gate != nil {
		d.Takeover = gate
	}
	kept := &handover.Parcels{}
	d.Keeper = kept
	memory.ServingGCPercent(servingGCPercent)
	d.Started = role.NewStarted(memory.ReleaseStartup)
	err := readPodsFromRelays(d)
	var fs []Feature
	if err == nil {
		fs, err = features(d)
	}
	if gate != nil {
		// Each feature waits in the gate once, in its loop or in
		// nodeview.Await.
		gate.Expect(len(fs))
	}
	return []role.Runnable{{Role: v1alpha1.RoleNode, Run: func(ctx context.Context) error {
		if err != nil {
			return err
		}
		return runAgent(ctx, d, fs, gate, kept)
	}}}
}

// readPodsFromRelays has the process's pods read from the pod relays of
// --pod-relay, when it names them (docs/scale.md: the watch fan-out).
func readPodsFromRelays(d role.Deps) error {
	pr := d.Config.Node.PodRelay
	if pr.Service == "" || d.Factory == nil || d.RestConfig == nil {
		return nil
	}
	c, err := podrelay.Client(d.Factory.Client(), d.RestConfig, pr.Service, pr.CAFile, d.Config.Node.NodeName)
	if err != nil {
		return err
	}
	d.Factory.Source(informer.Pods, c)
	d.Log.Info("reading pods from the pod relays", "service", pr.Service)
	return nil
}

// Run runs the features side by side until ctx ends or one fails, which
// stops the others.
func Run(ctx context.Context, fs []Feature) error {
	runs := make([]func(context.Context) error, len(fs))
	for i, f := range fs {
		runs[i] = f.Run
	}
	return role.Together(ctx, runs...)
}
