// Package conflist is netplane's CNI network configuration: the list that
// netplane --role=node writes into the runtime's configuration directory, and
// its netplane-cni entry, which the runtime passes to the plugin on stdin.
// Writer and plugin use these types, so a field one writes is a field the
// other reads; node.go names what the plugin makes on the node, which the
// node agent's cleanup removes. It imports no Kubernetes package:
// cmd/netplane-cni links it.
package conflist

import "github.com/containernetworking/cni/pkg/types"

// Type is the plugin's name in a conflist.
const Type = "netplane-cni"

// List is the conflist file.
type List struct {
	CNIVersion  string   `json:"cniVersion"`
	CNIVersions []string `json:"cniVersions"`
	Name        string   `json:"name"`
	Plugins     []Plugin `json:"plugins"`
}

// Plugin is the netplane-cni entry. The standard fields are spelled out
// rather than taken from types.PluginConf by embedding: its MarshalJSON
// would be promoted and write the standard fields only.
type Plugin struct {
	// What the node agent writes, in the order of the file's keys
	// (alphabetical, as the file has always been written).

	// Bridge is the node bridge pods attach to.
	Bridge       string          `json:"bridge"`
	Capabilities map[string]bool `json:"capabilities,omitempty"`
	// MTU of the bridge and both veth ends: the node's pod MTU
	// (nodeview.Settings.PodMTU); ADD refuses a conflist without one.
	MTU int `json:"mtu"`
	// PodCIDRs of this node, at most one per family.
	PodCIDRs []string `json:"podCIDRs"`
	// StateDir holds the IPAM store.
	StateDir string `json:"stateDir"`
	Type     string `json:"type"`

	// What the runtime adds when it passes the entry to the plugin.

	CNIVersion    string         `json:"cniVersion,omitempty"`
	Name          string         `json:"name,omitempty"`
	RuntimeConfig RuntimeConfig  `json:"runtimeConfig,omitzero"`
	Args          Args           `json:"args,omitzero"`
	RawPrevResult map[string]any `json:"prevResult,omitempty"`
	// ValidAttachments comes with GC only.
	ValidAttachments []types.GCAttachment `json:"cni.dev/valid-attachments,omitempty"`

	// Read but never written by netplane: an ipam section is refused
	// (the plugin allocates addresses itself); dns is passed into ADD's
	// result.
	IPAM types.IPAM `json:"ipam,omitzero"`
	DNS  types.DNS  `json:"dns,omitzero"`
}

// RuntimeConfig carries the capabilities the entry declares, filled in by
// the runtime per pod.
type RuntimeConfig struct {
	PortMappings []PortMapping `json:"portMappings,omitempty"`
	IPs          []string      `json:"ips,omitempty"`
}

// PortMapping is one element of the portMappings capability (a hostPort).
type PortMapping struct {
	HostPort      int    `json:"hostPort"`
	ContainerPort int    `json:"containerPort"`
	Protocol      string `json:"protocol"`
	HostIP        string `json:"hostIP,omitempty"`
}

// Args is the args section, where some runtimes put requested addresses.
type Args struct {
	CNI struct {
		IPs []string `json:"ips,omitempty"`
	} `json:"cni"`
}
