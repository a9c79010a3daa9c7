package conflist

// What the plugin makes on the node beside the pods, named here so that
// the node agent's cleanup (netplane --role=node --cleanup) finds it
// without linking the plugin.
const (
	// VethPrefix starts the name of every host end of a pod's veth.
	VethPrefix = "npv"
	// HostPortTable is the name of the plugin's inet table of hostPorts.
	HostPortTable = "netplane-hostports"
)
