package v1alpha1

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Validate reports every invalid field, each with its path as it is written
// in a configuration file (node.clusterCIDRs[1]). ErrorOf turns the list
// into the error a user reads.
func (c *Configuration) Validate() field.ErrorList {
	v := &validator{}
	if c.APIVersion != "" && c.APIVersion != GroupVersion {
		v.invalid(field.NewPath("apiVersion"), c.APIVersion, "must be "+GroupVersion)
	}
	if c.Kind != "" && c.Kind != Kind {
		v.invalid(field.NewPath("kind"), c.Kind, "must be "+Kind)
	}
	if err := ValidateRoles(c.Roles); err != nil {
		v.errs = append(v.errs, field.Invalid(field.NewPath("roles"), field.OmitValueType{}, err.Error()))
	}
	v.hostPort(field.NewPath("healthBindAddress"), c.HealthBindAddress, true)
	v.hostPort(field.NewPath("metricsBindAddress"), c.MetricsBindAddress, true)
	v.hostPort(field.NewPath("pprofBindAddress"), c.PprofBindAddress, true)
	v.between(field.NewPath("shutdownTimeout"), c.ShutdownTimeout.Duration, time.Second, 5*time.Minute)

	cc, p := c.ClientConnection, field.NewPath("clientConnection")
	v.positive(p.Child("qps"), cc.QPS)
	v.intRange(p.Child("burst"), int(cc.Burst), 1, 100000)
	if e := cc.ControlPlaneEndpoint; e != "" && !strings.HasPrefix(e, "https://") && !strings.HasPrefix(e, "http://") {
		v.invalid(p.Child("controlPlaneEndpoint"), e, "must be a URL like https://10.0.0.1:6443")
	}

	v.controller(c.Controller)
	v.dns(c)
	v.node(c)
	v.relay(c)
	return v.errs
}

// relay checks the relay role's settings and a node role's reading of
// relays. Either reads pods on its own: beside another role of the same
// process, which reads pods whole, the relay's view would be shared.
func (v *validator) relay(c *Configuration) {
	r, p := c.Relay, field.NewPath("relay")
	if slices.Contains(c.Roles, RoleRelay) {
		if len(c.Roles) > 1 {
			v.errs = append(v.errs, field.Invalid(field.NewPath("roles"), field.OmitValueType{}, "the relay role runs alone in its process"))
		}
		v.hostPort(p.Child("bindAddress"), r.BindAddress, false)
		v.nonEmpty(p.Child("tlsCertFile"), r.TLSCertFile)
		v.nonEmpty(p.Child("tlsKeyFile"), r.TLSKeyFile)
	}
	pr, pp := c.Node.PodRelay, field.NewPath("node", "podRelay")
	if pr.Service == "" {
		return
	}
	if ns, name, ok := strings.Cut(pr.Service, "/"); !ok || ns == "" || name == "" {
		v.invalid(pp.Child("service"), pr.Service, `must be namespace/name like kube-system/netplane-relay, or "" to read pods from the API server`)
	}
	v.nonEmpty(pp.Child("caFile"), pr.CAFile)
	if len(c.Roles) != 1 || c.Roles[0] != RoleNode {
		v.invalid(pp.Child("service"), pr.Service, "pods are read from relays by a process running the node role alone")
	}
}

func (v *validator) controller(ct Controller) {
	p := field.NewPath("controller")
	v.intRange(p.Child("maxEndpointsPerSlice"), int(ct.MaxEndpointsPerSlice), 1, 1000)
	v.intRange(p.Child("mirroringMaxEndpointsPerSubset"), int(ct.MirroringMaxEndpointsPerSubset), 1, 1000)
	v.between(p.Child("endpointUpdatesBatchPeriod"), ct.EndpointUpdatesBatchPeriod.Duration, 0, time.Minute)
	v.intRange(p.Child("concurrentSyncs"), int(ct.ConcurrentSyncs), 1, 100)
	v.positive(p.Child("kubeAPIQPS"), ct.KubeAPIQPS)
	v.intRange(p.Child("kubeAPIBurst"), int(ct.KubeAPIBurst), 1, 100000)
	if le, p := ct.LeaderElection, p.Child("leaderElection"); le.LeaderElect {
		v.nonEmpty(p.Child("resourceNamespace"), le.ResourceNamespace)
		v.nonEmpty(p.Child("resourceName"), le.ResourceName)
		if le.LeaseDuration.Duration <= le.RenewDeadline.Duration {
			v.invalid(p.Child("leaseDuration"), le.LeaseDuration.Duration, fmt.Sprintf("must be greater than renewDeadline (%v)", le.RenewDeadline.Duration))
		}
		if le.RetryPeriod.Duration <= 0 || le.RenewDeadline.Duration <= le.RetryPeriod.Duration {
			v.invalid(p.Child("retryPeriod"), le.RetryPeriod.Duration, fmt.Sprintf("must be greater than 0 and less than renewDeadline (%v)", le.RenewDeadline.Duration))
		}
	}

}

func (v *validator) dns(c *Configuration) {
	d, p := c.DNS, field.NewPath("dns")
	v.hostPort(p.Child("bindAddress"), d.BindAddress, false)
	if !validDomain(d.ClusterDomain) {
		v.invalid(p.Child("clusterDomain"), d.ClusterDomain, "must be a DNS name like cluster.local")
	}
	v.intRange(p.Child("ttl"), int(d.TTL), 0, 3600)
	if !slices.Contains([]string{PodRecordsDisabled, PodRecordsInsecure, PodRecordsVerified}, d.PodRecords) {
		v.invalid(p.Child("podRecords"), d.PodRecords, "must be one of disabled, insecure, verified")
	}
	v.errs = append(v.errs, ValidateForwarding(d.ClusterDomain, d.StubDomains, d.UpstreamServers, p.Child("stubDomains"), p.Child("upstreamServers"))...)
	if len(d.UpstreamServers) == 0 {
		v.nonEmpty(p.Child("resolvConf"), d.ResolvConf)
	}
	v.between(p.Child("upstreamTimeout"), d.UpstreamTimeout.Duration, 100*time.Millisecond, time.Minute)
	v.intRange(p.Child("cacheSize"), int(d.CacheSize), 0, 10_000_000)
	v.between(p.Child("cacheMaxTTL"), d.CacheMaxTTL.Duration, 0, 24*time.Hour)
	v.between(p.Child("serveStale"), d.ServeStale.Duration, 0, 7*24*time.Hour)
	if ns, name, ok := strings.Cut(d.KubeDNSConfigMap, "/"); d.KubeDNSConfigMap != "" && (!ok || ns == "" || name == "") {
		v.invalid(p.Child("kubeDNSConfigMap"), d.KubeDNSConfigMap, `must be namespace/name like kube-system/kube-dns, or "" to read none`)
	}
	if lame := d.Lameduck.Duration; lame < 0 || (slices.Contains(c.Roles, RoleDNS) && lame >= c.ShutdownTimeout.Duration) {
		v.invalid(p.Child("lameduck"), lame, fmt.Sprintf("must be at least 0 and less than shutdownTimeout (%v)", c.ShutdownTimeout.Duration))
	}
	if ns, name, ok := strings.Cut(d.DNSService, "/"); !ok || ns == "" || name == "" {
		v.invalid(p.Child("dnsService"), d.DNSService, "must be namespace/name")
	}

}

func (v *validator) node(c *Configuration) {
	n, p := c.Node, field.NewPath("node")
	if slices.Contains(c.Roles, RoleNode) {
		v.nonEmpty(p.Child("nodeName"), n.NodeName)
	}
	v.prefixes(p.Child("clusterCIDRs"), n.ClusterCIDRs, false)
	v.prefixes(p.Child("serviceCIDRs"), n.ServiceCIDRs, true)
	for i, a := range n.NodePortAddresses {
		if _, err := netip.ParsePrefix(a); err != nil && a != "primary" {
			v.invalid(p.Child("nodePortAddresses").Index(i), a, `must be a CIDR or "primary"`)
		}
	}
	v.between(p.Child("syncPeriod"), n.SyncPeriod.Duration, time.Second, time.Hour)
	v.between(p.Child("minSyncPeriod"), n.MinSyncPeriod.Duration, 0, n.SyncPeriod.Duration)
	v.hostPort(p.Child("proxyHealthzBindAddress"), n.ProxyHealthzBindAddress, true)
	v.between(p.Child("conntrack", "tcpEstablishedTimeout"), n.Conntrack.TCPEstablishedTimeout.Duration, 0, 30*24*time.Hour)
	v.between(p.Child("conntrack", "tcpCloseWaitTimeout"), n.Conntrack.TCPCloseWaitTimeout.Duration, 0, 30*24*time.Hour)
	v.nonEmpty(p.Child("cniConfDir"), n.CNIConfDir)
	v.nonEmpty(p.Child("cniBinDir"), n.CNIBinDir)
	v.nonEmpty(p.Child("ipamStateDir"), n.IPAMStateDir)
	if !strings.HasPrefix(n.ProcSysDir, "/") {
		v.invalid(p.Child("procSysDir"), n.ProcSysDir, "must be an absolute path like /proc/sys")
	}
	if n.Bridge == "" || len(n.Bridge) > 15 || strings.ContainsAny(n.Bridge, "/ \t") {
		v.invalid(p.Child("bridge"), n.Bridge, "must be an interface name of 1 to 15 characters")
	}
	v.intRange(p.Child("mtu"), int(n.MTU), 0, 65535)
	if n.MTU != 0 && n.MTU < 576 {
		v.invalid(p.Child("mtu"), n.MTU, "must be 0 (auto) or at least 576")
	}
	o := p.Child("overlay")
	if !slices.Contains([]string{OverlayCrossSubnet, OverlayAlways, OverlayNever}, n.Overlay.Mode) {
		v.invalid(o.Child("mode"), n.Overlay.Mode, "must be one of cross-subnet, always, never")
	}
	v.intRange(o.Child("vxlanPort"), int(n.Overlay.VXLANPort), 1, 65535)
	v.intRange(o.Child("vxlanVNI"), int(n.Overlay.VXLANVNI), 0, 1<<24-1)
	e := p.Child("encryption")
	if !slices.Contains([]string{EncryptionNone, EncryptionWireGuard}, n.Encryption.Mode) {
		v.invalid(e.Child("mode"), n.Encryption.Mode, "must be one of none, wireguard")
	}
	v.intRange(e.Child("wireguardPort"), int(n.Encryption.WireGuardPort), 1, 65535)
	if !slices.Contains([]string{WireGuardAuto, WireGuardKernel, WireGuardUserspace}, n.Encryption.Implementation) {
		v.invalid(e.Child("implementation"), n.Encryption.Implementation, "must be one of auto, kernel, userspace")
	}
	if !strings.HasPrefix(n.Encryption.PrivateKeyFile, "/") {
		v.invalid(e.Child("privateKeyFile"), n.Encryption.PrivateKeyFile, "must be an absolute path like /var/lib/netplane/wireguard/private.key")
	}
}

// ValidateRoles accepts a non-empty list of known roles without repeats.
func ValidateRoles(roles []string) error {
	if len(roles) == 0 {
		return fmt.Errorf("no role given: set --role to one or more of %s", strings.Join(Roles, ","))
	}
	seen := map[string]bool{}
	for _, r := range roles {
		if !slices.Contains(Roles, r) {
			return fmt.Errorf("unknown role %q: valid roles are %s", r, strings.Join(Roles, ","))
		}
		if seen[r] {
			return fmt.Errorf("role %q given twice", r)
		}
		seen[r] = true
	}
	return nil
}

type validator struct{ errs field.ErrorList }

func (v *validator) invalid(p *field.Path, got any, detail string) {
	v.errs = append(v.errs, field.Invalid(p, got, detail))
}

func (v *validator) positive(p *field.Path, got float32) {
	if got <= 0 {
		v.invalid(p, got, "must be greater than 0")
	}
}

func (v *validator) intRange(p *field.Path, got, lo, hi int) {
	if got < lo || got > hi {
		v.invalid(p, got, fmt.Sprintf("must be between %d and %d", lo, hi))
	}
}

func (v *validator) between(p *field.Path, got, lo, hi time.Duration) {
	if got < lo || got > hi {
		v.invalid(p, got, fmt.Sprintf("must be between %v and %v", lo, hi))
	}
}

func (v *validator) nonEmpty(p *field.Path, got string) {
	if got == "" {
		v.errs = append(v.errs, field.Required(p, "must not be empty"))
	}
}

// hostPort checks a listen address; port 0 asks the kernel for a free port.
func (v *validator) hostPort(p *field.Path, got string, mayBeEmpty bool) {
	if got == "" && mayBeEmpty {
		return
	}
	host, port, err := net.SplitHostPort(got)
	if err == nil && host != "" {
		if _, perr := netip.ParseAddr(host); perr != nil && host != "localhost" {
			err = fmt.Errorf("host is not an IP address")
		}
	}
	if err == nil {
		_, err = net.LookupPort("tcp", port)
	}
	if err != nil {
		v.invalid(p, got, "must be host:port like 0.0.0.0:10290 (port 0 picks a free one)")
	}
}

// prefixes checks CIDRs the decoder parsed already (a zero Prefix is one
// built in code, never parsed); onePerFamily is the API server's rule for
// --service-cluster-ip-range.
func (v *validator) prefixes(p *field.Path, cidrs []netip.Prefix, onePerFamily bool) {
	seen := map[bool]netip.Prefix{} // by "is IPv4"
	for i, c := range cidrs {
		if !c.IsValid() {
			v.invalid(p.Index(i), field.OmitValueType{}, "must be a CIDR like 10.244.0.0/16")
			continue
		}
		is4 := c.Addr().Is4()
		if other, dup := seen[is4]; dup && onePerFamily {
			v.invalid(p.Index(i), field.OmitValueType{}, fmt.Sprintf("at most one CIDR per IP family: %q and %q are both IPv%s",
				other, c, map[bool]string{true: "4", false: "6"}[is4]))
		}
		seen[is4] = c
	}
}

func validUpstream(s string) bool {
	if _, err := netip.ParseAddr(s); err == nil {
		return true
	}
	_, err := netip.ParseAddrPort(s)
	return err == nil
}

func validDomain(s string) bool {
	if s == "" || len(s) > 253 || strings.HasPrefix(s, ".") || strings.HasSuffix(s, ".") {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for _, r := range label {
			if !(r == '-' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
				return false
			}
		}
	}
	return true
}
