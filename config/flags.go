// Package config loads a v1alpha1.Configuration from three layers with viper:
// command-line flags win over NETPLANE_* environment variables, which win over
// the --config YAML file, which wins over the defaults. Every flag has an
// environment variable named after it (--max-endpoints-per-slice is
// NETPLANE_MAX_ENDPOINTS_PER_SLICE) and a key in the file.
package config

import (
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/netplane/netplane/apis/config/v1alpha1"
)

// flag ties a command-line flag to its key in the configuration file.
type flag struct {
	name string // flag name without dashes
	key  string // dotted path of json names in v1alpha1.Configuration
}

// EnvName is the environment variable that sets a flag.
func EnvName(flagName string) string {
	return "NETPLANE_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// ConfigFlag names the flag that points at the configuration file.
const ConfigFlag = "config"

// AddFlags registers every configuration flag on fs with the defaults of
// v1alpha1.Default, and returns the flag→key table that Load binds.
func AddFlags(fs *pflag.FlagSet) []flag {
	f := &flags{fs: fs}
	d := v1alpha1.Default()
	f.process(d)
	f.controller(d.Controller)
	f.dns(d.DNS)
	f.node(d.Node)
	f.relay(d.Relay)
	return f.table
}

// flags registers flags on fs and notes each one's key in table.
type flags struct {
	fs    *pflag.FlagSet
	table []flag
}

func (f *flags) add(name, key string) { f.table = append(f.table, flag{name, key}) }

func (f *flags) str(name, key, def, usage string) { f.fs.String(name, def, usage); f.add(name, key) }

func (f *flags) strs(name, key string, def []string, usage string) {
	f.fs.StringSlice(name, def, usage)
	f.add(name, key)
}

func (f *flags) i32(name, key string, def int32, usage string) {
	f.fs.Int32(name, def, usage)
	f.add(name, key)
}

func (f *flags) f32(name, key string, def float32, usage string) {
	f.fs.Float32(name, def, usage)
	f.add(name, key)
}

func (f *flags) boolean(name, key string, def bool, usage string) {
	f.fs.Bool(name, def, usage)
	f.add(name, key)
}

func (f *flags) dur(name, key string, def time.Duration, usage string) {
	f.fs.Duration(name, def, usage)
	f.add(name, key)
}

// process registers the flags of the whole process: roles, API client,
// health and metrics servers.
func (f *flags) process(d *v1alpha1.Configuration) {
	f.fs.String(ConfigFlag, "", "Path to a Configuration YAML file (apiVersion netplane.io/v1alpha1). Flags and NETPLANE_* variables override it.")
	f.strs("role", "roles", nil, "Roles to run, comma-separated: controller, dns, node, relay.")

	f.str("kubeconfig", "clientConnection.kubeconfig", "", "Path to a kubeconfig. Empty: $KUBECONFIG, then the in-cluster config.")
	f.str("control-plane-endpoint", "clientConnection.controlPlaneEndpoint", "", "API server URL (https://host:port) overriding the kubeconfig's; the node role needs it where the kubernetes Service VIP is not yet programmed.")
	f.f32("kube-api-qps", "clientConnection.qps", d.ClientConnection.QPS, "Client-side queries per second to the API server.")
	f.i32("kube-api-burst", "clientConnection.burst", d.ClientConnection.Burst, "Client-side burst of queries to the API server.")
	f.str("health-bind-address", "healthBindAddress", d.HealthBindAddress, "host:port serving /healthz and /readyz; port 0 picks a free port, \"\" disables.")
	f.str("metrics-bind-address", "metricsBindAddress", d.MetricsBindAddress, "host:port serving Prometheus /metrics; port 0 picks a free port, \"\" disables.")
	f.str("pprof-bind-address", "pprofBindAddress", d.PprofBindAddress, "host:port serving Go's /debug/pprof profiles (heap, CPU, goroutines); \"\" (the default) disables. Bind it to loopback.")
	f.dur("shutdown-timeout", "shutdownTimeout", d.ShutdownTimeout.Duration, "Longest time a graceful stop after SIGTERM may take.")
}

// controller registers the controller role's flags.
func (f *flags) controller(c v1alpha1.Controller) {
	f.i32("max-endpoints-per-slice", "controller.maxEndpointsPerSlice", c.MaxEndpointsPerSlice, "Most endpoints in one EndpointSlice (1 to 1000).")
	f.i32("mirroring-max-endpoints-per-subset", "controller.mirroringMaxEndpointsPerSubset", c.MirroringMaxEndpointsPerSubset, "Most addresses mirrored from one Endpoints subset (1 to 1000).")
	f.dur("endpoint-updates-batch-period", "controller.endpointUpdatesBatchPeriod", c.EndpointUpdatesBatchPeriod.Duration, "Window in which pod changes to one Service are coalesced into one sync.")
	f.i32("concurrent-service-endpoint-syncs", "controller.concurrentSyncs", c.ConcurrentSyncs, "Services synced at once.")
	f.f32("controller-kube-api-qps", "controller.kubeAPIQPS", c.KubeAPIQPS, "Queries per second of the controller role's EndpointSlice writes (kube-controller-manager uses 20).")
	f.i32("controller-kube-api-burst", "controller.kubeAPIBurst", c.KubeAPIBurst, "Burst of the controller role's EndpointSlice writes (kube-controller-manager uses 30).")
	f.boolean("leader-elect", "controller.leaderElection.leaderElect", c.LeaderElection.LeaderElect, "Elect a leader among controller replicas so only one writes.")
	f.str("leader-elect-resource-namespace", "controller.leaderElection.resourceNamespace", c.LeaderElection.ResourceNamespace, "Namespace of the leader election Lease.")
	f.str("leader-elect-resource-name", "controller.leaderElection.resourceName", c.LeaderElection.ResourceName, "Name of the leader election Lease.")
	f.dur("leader-elect-lease-duration", "controller.leaderElection.leaseDuration", c.LeaderElection.LeaseDuration.Duration, "How long a non-leader waits before taking over.")
	f.dur("leader-elect-renew-deadline", "controller.leaderElection.renewDeadline", c.LeaderElection.RenewDeadline.Duration, "How long the leader retries renewing before it gives up.")
	f.dur("leader-elect-retry-period", "controller.leaderElection.retryPeriod", c.LeaderElection.RetryPeriod.Duration, "Wait between leader election attempts.")
}

// dns registers the DNS role's flags.
func (f *flags) dns(n v1alpha1.DNS) {
	f.str("dns-bind-address", "dns.bindAddress", n.BindAddress, "host:port the DNS server listens on, UDP and TCP.")
	f.str("cluster-domain", "dns.clusterDomain", n.ClusterDomain, "The cluster's DNS domain.")
	f.i32("ttl", "dns.ttl", n.TTL, "TTL of cluster records in seconds (0 to 3600).")
	f.str("pod-records", "dns.podRecords", n.PodRecords, "Pod A records: disabled, insecure (any name in the pod form) or verified (only existing pods).")
	f.boolean("autopath", "dns.autopath", n.Autopath, "Resolve a known pod's search path on the server and answer with a CNAME.")
	f.strs("upstream-servers", "dns.upstreamServers", nil, "DNS servers (IP or IP:port) for names outside the cluster domain and the stub domains. Empty: the nameservers of --resolv-conf.")
	f.str("resolv-conf", "dns.resolvConf", n.ResolvConf, "resolv.conf that names the upstream servers when --upstream-servers is empty.")
	f.dur("upstream-timeout", "dns.upstreamTimeout", n.UpstreamTimeout.Duration, "Time after which a query forwarded upstream is answered with SERVFAIL.")
	f.i32("cache-size", "dns.cacheSize", n.CacheSize, "Most answers held in the forwarding cache (0 disables it).")
	f.dur("cache-max-ttl", "dns.cacheMaxTTL", n.CacheMaxTTL.Duration, "Longest time an upstream answer is cached.")
	f.dur("dns-serve-stale", "dns.serveStale", n.ServeStale.Duration, "Answer a name from its expired cached answer (TTL 30s) for up to this long after it expired, while every server of the name fails; 0 never does.")
	f.str("kube-dns-configmap", "dns.kubeDNSConfigMap", n.KubeDNSConfigMap, "namespace/name of the kube-dns ConfigMap whose stubDomains and upstreamNameservers are applied on every change; \"\" reads none.")
	f.str("dns-service", "dns.dnsService", n.DNSService, "namespace/name of the Service whose ClusterIPs are the zone's name server.")
	f.dur("lameduck", "dns.lameduck", n.Lameduck.Duration, "After SIGTERM, keep answering at least this long with /readyz failing, and then while this server is still a ready endpoint of --dns-service (until --shutdown-timeout less 2s), so nodes stop sending queries before the sockets close.")
}

// node registers the node role's flags, and those of its --cleanup.
func (f *flags) node(o v1alpha1.Node) {
	f.str("node-name", "node.nodeName", o.NodeName, "Name of the Node this agent runs on.")
	f.strs("cluster-cidr", "node.clusterCIDRs", nil, "Pod CIDRs of the cluster, any number per family; traffic to a ClusterIP from outside all of them is masqueraded, pod traffic to them is not. Unset: every Node's pod CIDRs.")
	f.strs("service-cidrs", "node.serviceCIDRs", nil, "The API server's --service-cluster-ip-range, at most one CIDR per family; traffic to an unallocated address in them is dropped. Empty: no such drop.")
	f.boolean("masquerade-all", "node.masqueradeAll", o.MasqueradeAll, "Masquerade all traffic to ClusterIPs, not only that from outside --cluster-cidr.")
	f.strs("nodeport-addresses", "node.nodePortAddresses", nil, "CIDRs whose node addresses accept NodePort traffic and serve health-check node ports, or \"primary\". Empty: the node's primary IPs.")
	f.dur("sync-period", "node.syncPeriod", o.SyncPeriod.Duration, "Period of full resyncs that heal rules changed by someone else.")
	f.dur("min-sync-period", "node.minSyncPeriod", o.MinSyncPeriod.Duration, "Shortest time between two syncs; changes in between are batched.")
	f.str("proxy-healthz-bind-address", "node.proxyHealthzBindAddress", o.ProxyHealthzBindAddress, "host:port of kube-proxy's node health server (/healthz, /livez) that cloud load balancers ask; \"\" disables.")
	f.str("agent-socket", "node.agentSocket", o.AgentSocket, "Unix socket through which a node agent started beside a running one (a DaemonSet surge) takes the node over once its views synced; \"\" disables.")
	f.dur("conntrack-tcp-timeout-established", "node.conntrack.tcpEstablishedTimeout", o.Conntrack.TCPEstablishedTimeout.Duration, "Idle timeout of established TCP connections in conntrack (0: the kernel's).")
	f.dur("conntrack-tcp-timeout-close-wait", "node.conntrack.tcpCloseWaitTimeout", o.Conntrack.TCPCloseWaitTimeout.Duration, "Conntrack timeout of TCP connections in CLOSE_WAIT (0: the kernel's).")
	f.str("cni-conf-dir", "node.cniConfDir", o.CNIConfDir, "Directory the CNI configuration is written to.")
	f.str("cni-bin-dir", "node.cniBinDir", o.CNIBinDir, "Directory the netplane-cni plugin is installed into.")
	f.str("cni-plugin-path", "node.cniPluginPath", o.CNIPluginPath, "Plugin binary to install. Empty: netplane-cni beside this executable.")
	f.str("ipam-state-dir", "node.ipamStateDir", o.IPAMStateDir, "Directory of the CNI plugin's IP allocation store.")
	f.str("bridge", "node.bridge", o.Bridge, "Name of the node's pod bridge.")
	f.str("proc-sys-dir", "node.procSysDir", o.ProcSysDir, "Where to write network sysctls: /proc/sys, or a mount of the host's /proc/sys/net (as /host/proc/sys/net) in an unprivileged pod.")
	f.i32("mtu", "node.mtu", o.MTU, "MTU of pod interfaces and of the WireGuard device; 0 uses the underlay interface's MTU less what the paths to other nodes add (VXLAN 50 or 70 bytes, WireGuard 60 or 80, over IPv4 or IPv6).")
	f.boolean("network-policy", "node.networkPolicy.enabled", o.NetworkPolicy.Enabled, "Enforce NetworkPolicies for this node's pods (table inet netplane-policy); false removes the table.")
	f.boolean("network-policy-log-denied", "node.networkPolicy.logDenied", o.NetworkPolicy.LogDenied, "Log one rate-limited line per connection a NetworkPolicy denies.")
	f.str("overlay", "node.overlay.mode", o.Overlay.Mode, "How pod traffic reaches other nodes: cross-subnet (direct routes within this node's subnets, VXLAN across), always (VXLAN), never (direct routes only).")
	f.i32("vxlan-port", "node.overlay.vxlanPort", o.Overlay.VXLANPort, "UDP port of the VXLAN overlay.")
	f.i32("vxlan-vni", "node.overlay.vxlanVNI", o.Overlay.VXLANVNI, "VXLAN network identifier of the overlay.")
	f.str("encryption", "node.encryption.mode", o.Encryption.Mode, "Encryption of pod traffic between nodes: none, or wireguard (through the device netplane.wg).")
	f.i32("wireguard-port", "node.encryption.wireguardPort", o.Encryption.WireGuardPort, "UDP port of the WireGuard device.")
	f.str("wireguard-implementation", "node.encryption.implementation", o.Encryption.Implementation, "WireGuard implementation: auto (the kernel's when it has it, else in-process), kernel, userspace.")
	f.boolean("wireguard-permissive", "node.encryption.permissive", o.Encryption.Permissive, "For rolling encryption in or out of a running cluster: send to nodes without a valid WireGuard key in clear by the overlay instead of dropping, and keep the overlay.")
	f.str("wireguard-private-key-file", "node.encryption.privateKeyFile", o.Encryption.PrivateKeyFile, "This node's WireGuard private key; made on first start (mode 0600), kept across restarts; delete it to rotate the key.")
	f.str("pod-relay", "node.podRelay.service", "", "namespace/name of the Service of pod relays (--role=relay) to read pods from instead of the API server; \"\" reads them from the API server.")
	f.str("pod-relay-ca-file", "node.podRelay.caFile", "", "Certificate authority of the pod relays' serving certificates (which name the Service: name.namespace.svc).")
	f.fs.Bool(CleanupFlag, false, "Remove what the node role made on this node (its nftables tables, bridge, VXLAN and WireGuard devices, routes and rules, CNI conflist and plugin, IPAM store, WireGuard key) and exit, as kube-proxy --cleanup does; with --role=node and the node's settings.")
	f.fs.Bool(CleanupKeepIPAMFlag, false, "With --cleanup, keep the CNI plugin's IPAM store.")
}

// relay registers the relay role's flags.
func (f *flags) relay(r v1alpha1.Relay) {
	f.str("relay-bind-address", "relay.bindAddress", r.BindAddress, "host:port the pod relay serves node roles on, over HTTPS.")
	f.str("relay-tls-cert-file", "relay.tlsCertFile", r.TLSCertFile, "The pod relay's serving certificate (PEM), naming its Service.")
	f.str("relay-tls-key-file", "relay.tlsKeyFile", r.TLSKeyFile, "The key of --relay-tls-cert-file.")
}
