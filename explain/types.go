// Package explain says why a connection from a pod (or an address) to a
// pod, a Service, a name or an address works or fails, step by step, from
// the API objects down to a node's kernel: the DNS answer, the Service's
// endpoints and the ones the source's node would choose, NetworkPolicy at
// both ends, the path between the nodes, and on a node whether its kernel
// holds what the model says. Its core is pure: the API objects one
// question needs in, an Explanation out, computed by the same code the
// roles run (dns, proxy, policy, overlay). The shell (cmd/netplane) reads
// only those objects from the API server, and the kernel through Kernel.
// It never writes to either.
package explain

// APIVersion and Kind of the JSON object (docs/explain.md).
const (
	APIVersion = "netplane.io/v1alpha1"
	Kind       = "Explanation"
)

// Verdicts.
const (
	Allowed = "Allowed"
	Denied  = "Denied"
)

// Policy directions and effects.
const (
	DirIngress = "Ingress"
	DirEgress  = "Egress"
	Allows     = "Allows"
	Isolates   = "Isolates"
)

// Paths to a backend.
const (
	PathLocal     = "local"     // the source is the backend
	PathSameNode  = "same-node" // over the node's bridge
	PathDirect    = "direct"    // a route via the other node's InternalIP
	PathVXLAN     = "vxlan"     // through the VXLAN device
	PathWireGuard = "wireguard" // encrypted, through the WireGuard device
	PathUnknown   = "unknown"   // decided by subnets only the node knows
	PathNone      = "none"      // the node has no route
	PathOutside   = "outside"   // between the backend's node and a client outside the cluster
)

// Explanation is the answer, as `-o json` prints it.
type Explanation struct {
	APIVersion string        `json:"apiVersion"`
	Kind       string        `json:"kind"`
	From       Peer          `json:"from"`
	To         string        `json:"to"`
	Port       *Port         `json:"port,omitempty"`
	Resolution *Resolution   `json:"resolution,omitempty"`
	Service    *Service      `json:"service,omitempty"`
	Backends   []Backend     `json:"backends"`
	Kernel     *KernelReport `json:"kernel,omitempty"`
	Verdict    string        `json:"verdict"`
	// Reason is the verdict's one line.
	Reason string `json:"reason"`
}

// Peer is the source or a destination: a pod or a bare address.
type Peer struct {
	Pod  string `json:"pod,omitempty"` // NAMESPACE/NAME
	IP   string `json:"ip"`
	Node string `json:"node,omitempty"`
	// What names an address that is no pod's: "node NAME" or "external".
	What string `json:"what,omitempty"`
}

// Port is the destination port asked about.
type Port struct {
	Port     int    `json:"port"`
	Name     string `json:"name,omitempty"`
	Protocol string `json:"protocol"` // TCP, UDP, SCTP
}

// Resolution is how a name became an address.
type Resolution struct {
	Name   string   `json:"name"`
	Search []string `json:"search,omitempty"`
	Ndots  int      `json:"ndots"`
	Tried  []Query  `json:"tried"`
	// Address is the first address of the answer the resolver keeps.
	Address string `json:"address,omitempty"`
}

// Query is one name the resolver asks and what netplane's DNS answers.
type Query struct {
	Name   string   `json:"name"`
	Rcode  string   `json:"rcode"` // NOERROR, NXDOMAIN, ... or "upstream" when outside the zone
	Answer []string `json:"answer,omitempty"`
}

// Service is the Service the destination is, and its endpoints.
type Service struct {
	Namespace             string     `json:"namespace"`
	Name                  string     `json:"name"`
	Type                  string     `json:"type"`
	Address               string     `json:"address"` // the address the connection goes to
	Port                  int        `json:"port"`
	PortName              string     `json:"portName,omitempty"`
	NodePort              int        `json:"nodePort,omitempty"`
	SessionAffinity       string     `json:"sessionAffinity"`
	AffinityTimeout       int        `json:"affinityTimeoutSeconds,omitempty"`
	InternalTrafficPolicy string     `json:"internalTrafficPolicy"`
	ExternalTrafficPolicy string     `json:"externalTrafficPolicy,omitempty"`
	Endpoints             []Endpoint `json:"endpoints"`
	// ChosenBy is the node whose rules choose the backends ("" off any node).
	ChosenBy string `json:"chosenBy"`
	// Choice says how the node chooses: among all ready endpoints, by
	// topology, local only, terminating fallback, or "no endpoints".
	Choice string `json:"choice"`
	// Reject: the node rejects (no usable endpoint anywhere); Drop: it
	// drops (none it may use).
	Reject bool `json:"reject,omitempty"`
	Drop   bool `json:"drop,omitempty"`
}

// Endpoint is one endpoint of the Service's port from its EndpointSlices.
type Endpoint struct {
	IP          string `json:"ip"`
	Port        int    `json:"port"`
	Pod         string `json:"pod,omitempty"`
	Node        string `json:"node,omitempty"`
	Zone        string `json:"zone,omitempty"`
	Slice       string `json:"slice"`
	Ready       bool   `json:"ready"`
	Serving     bool   `json:"serving"`
	Terminating bool   `json:"terminating"`
	Chosen      bool   `json:"chosen"` // the source's node may send the connection here
}

// Backend is one pod the connection may reach, and what it meets there.
type Backend struct {
	Pod      string         `json:"pod"`
	IP       string         `json:"ip"`
	Port     int            `json:"port"`
	Node     string         `json:"node"`
	Verdict  string         `json:"verdict"`
	Path     string         `json:"path"`
	PathText string         `json:"pathText"`
	MTU      int            `json:"mtu,omitempty"`
	Egress   string         `json:"egress"`  // the source's egress, in words
	Ingress  string         `json:"ingress"` // the backend's ingress, in words
	Policies []PolicyEffect `json:"policies"`
}

// PolicyEffect is a policy that decides: a NetworkPolicy isolates one end
// in a direction, or one of its rules allows the connection; a rule of a
// ClusterNetworkPolicy (Tier set, no namespace) accepts, denies or passes.
type PolicyEffect struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Tier      string `json:"tier,omitempty"` // Admin, Baseline: a ClusterNetworkPolicy
	Direction string `json:"direction"`      // Ingress, Egress
	Effect    string `json:"effect"`         // Allows, Isolates; Accepts, Denies, Passes
	Rule      int    `json:"rule,omitempty"` // counting from 1
}

// KernelReport is what the kernel of the node explain runs on holds for
// the flow, against the model.
type KernelReport struct {
	Node        string   `json:"node"`
	Agrees      bool     `json:"agrees"`
	Differences []string `json:"differences"`
	Checked     []string `json:"checked,omitempty"`
	Conntrack   []string `json:"conntrack,omitempty"`
}
