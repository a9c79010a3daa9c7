// Package v1alpha1 holds netplane's versioned configuration file format, in
// the manner of kube-proxy's KubeProxyConfiguration: one document with a
// section per role, defaults that make an empty file useful, and validation
// whose errors name the field a user must change.
package v1alpha1

import (
	"net/netip"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	// GroupVersion is the apiVersion of a configuration file.
	GroupVersion = "netplane.io/v1alpha1"
	// Kind is the kind of a configuration file.
	Kind = "Configuration"
)

// Role names, as given to --role.
const (
	RoleController = "controller"
	RoleDNS        = "dns"
	RoleNode       = "node"
	RoleRelay      = "relay"
)

// Roles lists every valid role in the order they are started.
var Roles = []string{RoleController, RoleDNS, RoleNode, RoleRelay}

// Configuration is the whole configuration of one netplane process.
type Configuration struct {
	metav1.TypeMeta `json:",inline"`

	// Roles this process runs: any of controller, dns, node, relay.
	Roles []string `json:"roles,omitempty"`
	// ClientConnection says how to reach the Kubernetes API server.
	ClientConnection ClientConnection `json:"clientConnection"`
	// HealthBindAddress is host:port for /healthz and /readyz; "" disables it, port 0 picks one.
	HealthBindAddress string `json:"healthBindAddress"`
	// MetricsBindAddress is host:port for /metrics; "" disables it, port 0 picks one.
	MetricsBindAddress string `json:"metricsBindAddress"`
	// PprofBindAddress is host:port for Go's /debug/pprof profiles; ""
	// (the default) disables it. Profiles show the process's memory and
	// stacks: bind it to loopback.
	PprofBindAddress string `json:"pprofBindAddress,omitempty"`
	// ShutdownTimeout bounds a graceful stop after SIGTERM.
	ShutdownTimeout metav1.Duration `json:"shutdownTimeout"`

	Controller Controller `json:"controller"`
	DNS        DNS        `json:"dns"`
	Node       Node       `json:"node"`
	Relay      Relay      `json:"relay"`
}

// ClientConnection configures the Kubernetes client.
type ClientConnection struct {
	// Kubeconfig is a kubeconfig file; empty means $KUBECONFIG, then in-cluster config.
	Kubeconfig string `json:"kubeconfig"`
	// ControlPlaneEndpoint overrides the API server address (https://host:port).
	// The node role needs it where the kubernetes Service VIP is what it programs.
	ControlPlaneEndpoint string `json:"controlPlaneEndpoint"`
	// QPS and Burst are client-side rate limits, as client-go defines them.
	QPS   float32 `json:"qps"`
	Burst int32   `json:"burst"`
}

// Controller configures the EndpointSlice controller role.
type Controller struct {
	MaxEndpointsPerSlice           int32           `json:"maxEndpointsPerSlice"`
	MirroringMaxEndpointsPerSubset int32           `json:"mirroringMaxEndpointsPerSubset"`
	EndpointUpdatesBatchPeriod     metav1.Duration `json:"endpointUpdatesBatchPeriod"`
	ConcurrentSyncs                int32           `json:"concurrentSyncs"`
	LeaderElection                 LeaderElection  `json:"leaderElection"`
	// KubeAPIQPS and KubeAPIBurst limit the controllers' slice writes (not
	// their watches). They are higher than clientConnection's 20/30 because
	// write throughput is what bounds the time from a pod change to its
	// slice, and the API server's priority and fairness protects itself.
	KubeAPIQPS   float32 `json:"kubeAPIQPS"`
	KubeAPIBurst int32   `json:"kubeAPIBurst"`
}

// LeaderElection keeps two controller replicas from both writing.
type LeaderElection struct {
	LeaderElect       bool            `json:"leaderElect"`
	ResourceNamespace string          `json:"resourceNamespace"`
	ResourceName      string          `json:"resourceName"`
	LeaseDuration     metav1.Duration `json:"leaseDuration"`
	RenewDeadline     metav1.Duration `json:"renewDeadline"`
	RetryPeriod       metav1.Duration `json:"retryPeriod"`
}

// Pod record modes, as CoreDNS's kubernetes plugin names them.
const (
	PodRecordsDisabled = "disabled"
	PodRecordsInsecure = "insecure"
	PodRecordsVerified = "verified"
)

// DNS configures the cluster DNS role.
type DNS struct {
	BindAddress   string `json:"bindAddress"`
	ClusterDomain string `json:"clusterDomain"`
	TTL           int32  `json:"ttl"`
	PodRecords    string `json:"podRecords"`
	Autopath      bool   `json:"autopath"`
	// UpstreamServers answer every name outside the cluster domain and the
	// stub domains (IP or IP:port); empty means the nameservers of ResolvConf.
	UpstreamServers []string `json:"upstreamServers,omitempty"`
	// StubDomains forward the names under a domain to that domain's own
	// servers (IP or IP:port), the longest matching domain winning, as
	// kube-dns's stubDomains and CoreDNS's per-zone forward blocks do.
	// Changes to it and to UpstreamServers apply without a restart.
	StubDomains     map[string][]string `json:"stubDomains,omitempty"`
	ResolvConf      string              `json:"resolvConf"`
	UpstreamTimeout metav1.Duration     `json:"upstreamTimeout"`
	CacheSize       int32               `json:"cacheSize"`
	CacheMaxTTL     metav1.Duration     `json:"cacheMaxTTL"`
	// ServeStale answers a name from its expired cached answer, for up to
	// this long after it expired, while every server of the name fails
	// (RFC 8767); 0 never does.
	ServeStale metav1.Duration `json:"serveStale"`
	// KubeDNSConfigMap is namespace/name of the ConfigMap whose
	// stubDomains and upstreamNameservers (kube-dns's format) override the
	// file's, applied on every change; "" reads none.
	KubeDNSConfigMap string `json:"kubeDNSConfigMap"`
	// DNSService is namespace/name of the Service whose ClusterIPs are the zone's NS glue.
	DNSService string `json:"dnsService"`
	// Lameduck keeps answering at least this long after SIGTERM, with /readyz
	// failing, while the nodes stop sending queries to this server (CoreDNS's
	// lameduck), and after it while this server is still a ready endpoint of
	// DNSService, until ShutdownTimeout less 2s.
	Lameduck metav1.Duration `json:"lameduck"`
}

// Relay configures the pod relay role, which watches every pod once and
// serves node roles the part of each their rules read, so that the API
// server has one watch of every pod per relay instead of one per node.
type Relay struct {
	// BindAddress is host:port the relay serves node roles on (HTTPS).
	BindAddress string `json:"bindAddress"`
	// TLSCertFile and TLSKeyFile are its serving certificate and key.
	TLSCertFile string `json:"tlsCertFile"`
	TLSKeyFile  string `json:"tlsKeyFile"`
}

// Node configures the node agent: service proxy and pod networking.
type Node struct {
	NodeName string `json:"nodeName"`
	// ClusterCIDRs are the pod CIDRs, any number per family: traffic to a
	// ClusterIP from outside all of them is masqueraded, pod traffic to
	// them is not. Empty: every Node's spec.podCIDRs. Parsed (and masked
	// to their network) when the configuration is loaded, so every role
	// sees the same prefixes and a typo stops the process at start.
	ClusterCIDRs []netip.Prefix `json:"clusterCIDRs,omitempty"`
	// ServiceCIDRs are the API server's --service-cluster-ip-range, at most
	// one per family: traffic to an unallocated address in them is dropped
	// instead of leaving the node. Empty: no such drop (netplane does not
	// read the ServiceCIDR API, so the node role's RBAC stays at Services,
	// EndpointSlices and Nodes).
	ServiceCIDRs      []netip.Prefix  `json:"serviceCIDRs,omitempty"`
	MasqueradeAll     bool            `json:"masqueradeAll"`
	NodePortAddresses []string        `json:"nodePortAddresses,omitempty"`
	SyncPeriod        metav1.Duration `json:"syncPeriod"`
	MinSyncPeriod     metav1.Duration `json:"minSyncPeriod"`
	CNIConfDir        string          `json:"cniConfDir"`
	CNIBinDir         string          `json:"cniBinDir"`
	// CNIPluginPath is the plugin binary to install; empty means netplane-cni beside netplane.
	CNIPluginPath string `json:"cniPluginPath"`
	IPAMStateDir  string `json:"ipamStateDir"`
	Bridge        string `json:"bridge"`
	// ProcSysDir is where the node agent writes network sysctls: /proc/sys,
	// or a hostPath mount of the host's /proc/sys/net in an unprivileged pod.
	ProcSysDir string `json:"procSysDir"`
	// MTU of pod interfaces and of the WireGuard device; 0 means the MTU
	// of the underlay interface (the one carrying the node's address),
	// less the largest overhead of the paths to other nodes: VXLAN's
	// while the overlay may tunnel, WireGuard's with encryption on.
	MTU int32 `json:"mtu"`
	// ProxyHealthzBindAddress is host:port of kube-proxy's node health
	// server (/healthz, /livez), which cloud load balancers ask before
	// sending a node traffic; "" turns it off.
	ProxyHealthzBindAddress string `json:"proxyHealthzBindAddress"`
	// AgentSocket is a Unix socket on the node through which a node agent
	// started while another runs (a DaemonSet rolled with maxSurge) takes
	// the node over from it once its views have synced, so that the
	// in-process WireGuard's traffic has no gap and the node one writer;
	// "" turns it off. On the node's own filesystem (a hostPath).
	AgentSocket string `json:"agentSocket,omitempty"`
	// Conntrack sets the node's conntrack timeouts, as kube-proxy does.
	Conntrack Conntrack `json:"conntrack"`
	// NetworkPolicy configures the enforcement of NetworkPolicies.
	NetworkPolicy NetworkPolicy `json:"networkPolicy"`
	// PodRelay reads the cluster's pods from pod relays instead of the
	// API server.
	PodRelay PodRelay `json:"podRelay"`
	// Overlay configures how pod traffic reaches other nodes.
	Overlay Overlay `json:"overlay"`
	// Encryption configures the encryption of pod traffic between nodes.
	Encryption Encryption `json:"encryption"`
}

// Conntrack holds the conntrack timeouts the node role writes into the
// node's net.netfilter sysctls after its first sync; 0 leaves the kernel's.
// The defaults are kube-proxy's: an idle established TCP connection through
// a Service lives a day, one half-closed by the server an hour, where the
// kernel's 60 s would cut a client still reading.
type Conntrack struct {
	TCPEstablishedTimeout metav1.Duration `json:"tcpEstablishedTimeout"`
	TCPCloseWaitTimeout   metav1.Duration `json:"tcpCloseWaitTimeout"`
}

// NetworkPolicy configures NetworkPolicy enforcement on the node.
type NetworkPolicy struct {
	// Enabled enforces every NetworkPolicy for this node's pods in the
	// nftables table inet netplane-policy; false removes that table.
	Enabled bool `json:"enabled"`
	// LogDenied logs one line per denied connection (rate-limited), with
	// its source, destination, port and the pod the policy protects.
	LogDenied bool `json:"logDenied"`
}

// PodRelay is where a node role reads pods: from the ready endpoints of a
// Service of pod relays (the relay role), chosen by the node's name, the
// next one when one fails. Its EndpointSlices are read from the API
// server at each connection, so the relays' addresses need no Service
// network, which this role programs.
type PodRelay struct {
	// Service is namespace/name of the relays' Service; "" reads pods
	// from the API server.
	Service string `json:"service,omitempty"`
	// CAFile holds the certificate authority of the relays' serving
	// certificates, which name the Service (name.namespace.svc).
	CAFile string `json:"caFile,omitempty"`
}

// Overlay modes: how pod traffic reaches another node.
const (
	// OverlayCrossSubnet routes directly to nodes on one of this node's
	// connected subnets and through VXLAN to the others.
	OverlayCrossSubnet = "cross-subnet"
	// OverlayAlways sends pod traffic to every other node through VXLAN.
	OverlayAlways = "always"
	// OverlayNever routes directly only (the nodes must share a segment).
	OverlayNever = "never"
)

// Overlay configures the routes and the VXLAN overlay to other nodes.
type Overlay struct {
	// Mode is cross-subnet, always or never.
	Mode string `json:"mode"`
	// VXLANPort is the UDP port of the VXLAN devices (IANA's 4789).
	VXLANPort int32 `json:"vxlanPort"`
	// VXLANVNI is the VXLAN network identifier.
	VXLANVNI int32 `json:"vxlanVNI"`
}

// Encryption modes.
const (
	// EncryptionNone sends pod traffic between nodes as the overlay routes it.
	EncryptionNone = "none"
	// EncryptionWireGuard sends pod traffic to other nodes through WireGuard.
	EncryptionWireGuard = "wireguard"
)

// WireGuard implementations.
const (
	// WireGuardAuto uses the kernel's WireGuard when it has it, else the
	// in-process one.
	WireGuardAuto = "auto"
	// WireGuardKernel uses the kernel's WireGuard only.
	WireGuardKernel = "kernel"
	// WireGuardUserspace uses wireguard-go in-process on a TUN device.
	WireGuardUserspace = "userspace"
)

// Encryption configures the encryption of pod traffic between nodes.
type Encryption struct {
	// Mode is none or wireguard.
	Mode string `json:"mode"`
	// WireGuardPort is the UDP port the WireGuard device listens on.
	WireGuardPort int32 `json:"wireguardPort"`
	// Implementation is auto, kernel or userspace.
	Implementation string `json:"implementation"`
	// PrivateKeyFile holds this node's WireGuard private key; it is made
	// on first start and kept across restarts.
	PrivateKeyFile string `json:"privateKeyFile"`
	// Permissive, for rolling encryption in or out of a running cluster:
	// pod traffic to a node with a valid key goes through WireGuard, to
	// any other by the overlay's paths in clear, and the overlay stays.
	// Off (the default), traffic to a node without a valid key is dropped
	// and nothing addressed to the cluster's pod CIDRs leaves in clear.
	Permissive bool `json:"permissive,omitempty"`
}
