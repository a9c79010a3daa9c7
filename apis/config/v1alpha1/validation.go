package v1alpha1

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// Validate reports every invalid field, each error starting with the field's
// path as it is written in a configuration file.
func (c *Configuration) Validate() error {
	v := &validator{}
	if c.APIVersion != "" && c.APIVersion != GroupVersion {
		v.fail("apiVersion", "must be %s, got %q", GroupVersion, c.APIVersion)
	}
	if c.Kind != "" && c.Kind != Kind {
		v.fail("kind", "must be %s, got %q", Kind, c.Kind)
	}
	if err := ValidateRoles(c.Roles); err != nil {
		v.fail("roles", "%v", err)
	}
	v.hostPort("healthBindAddress", c.HealthBindAddress, true)
	v.hostPort("metricsBindAddress", c.MetricsBindAddress, true)
	v.between("shutdownTimeout", c.ShutdownTimeout.Duration, time.Second, 5*time.Minute)

	cc := c.ClientConnection
	if cc.QPS <= 0 {
		v.fail("clientConnection.qps", "must be greater than 0, got %v", cc.QPS)
	}
	v.intRange("clientConnection.burst", int(cc.Burst), 1, 100000)
	if e := cc.ControlPlaneEndpoint; e != "" && !strings.HasPrefix(e, "https://") && !strings.HasPrefix(e, "http://") {
		v.fail("clientConnection.controlPlaneEndpoint", "must be a URL like https://10.0.0.1:6443, got %q", e)
	}

	ct := c.Controller
	v.intRange("controller.maxEndpointsPerSlice", int(ct.MaxEndpointsPerSlice), 1, 1000)
	v.intRange("controller.mirroringMaxEndpointsPerSubset", int(ct.MirroringMaxEndpointsPerSubset), 1, 1000)
	v.between("controller.endpointUpdatesBatchPeriod", ct.EndpointUpdatesBatchPeriod.Duration, 0, time.Minute)
	v.intRange("controller.concurrentSyncs", int(ct.ConcurrentSyncs), 1, 100)
	if ct.KubeAPIQPS <= 0 {
		v.fail("controller.kubeAPIQPS", "must be greater than 0, got %v", ct.KubeAPIQPS)
	}
	v.intRange("controller.kubeAPIBurst", int(ct.KubeAPIBurst), 1, 100000)
	if le := ct.LeaderElection; le.LeaderElect {
		v.nonEmpty("controller.leaderElection.resourceNamespace", le.ResourceNamespace)
		v.nonEmpty("controller.leaderElection.resourceName", le.ResourceName)
		if le.LeaseDuration.Duration <= le.RenewDeadline.Duration {
			v.fail("controller.leaderElection.leaseDuration", "must be greater than renewDeadline (%v), got %v", le.RenewDeadline.Duration, le.LeaseDuration.Duration)
		}
		if le.RetryPeriod.Duration <= 0 || le.RenewDeadline.Duration <= le.RetryPeriod.Duration {
			v.fail("controller.leaderElection.retryPeriod", "must be greater than 0 and less than renewDeadline (%v), got %v", le.RenewDeadline.Duration, le.RetryPeriod.Duration)
		}
	}

	d := c.DNS
	v.hostPort("dns.bindAddress", d.BindAddress, false)
	if !validDomain(d.ClusterDomain) {
		v.fail("dns.clusterDomain", "must be a DNS name like cluster.local, got %q", d.ClusterDomain)
	}
	v.intRange("dns.ttl", int(d.TTL), 0, 3600)
	if !slices.Contains([]string{PodRecordsDisabled, PodRecordsInsecure, PodRecordsVerified}, d.PodRecords) {
		v.fail("dns.podRecords", "must be one of disabled, insecure, verified, got %q", d.PodRecords)
	}
	for i, u := range d.Upstream {
		if !validUpstream(u) {
			v.fail(fmt.Sprintf("dns.upstream[%d]", i), "must be an IP address or IP:port, got %q", u)
		}
	}
	if len(d.Upstream) == 0 {
		v.nonEmpty("dns.resolvConf", d.ResolvConf)
	}
	v.between("dns.upstreamTimeout", d.UpstreamTimeout.Duration, 100*time.Millisecond, time.Minute)
	v.intRange("dns.cacheSize", int(d.CacheSize), 0, 10_000_000)
	v.between("dns.cacheMaxTTL", d.CacheMaxTTL.Duration, 0, 24*time.Hour)
	if lame := d.Lameduck.Duration; lame < 0 || (slices.Contains(c.Roles, RoleDNS) && lame >= c.ShutdownTimeout.Duration) {
		v.fail("dns.lameduck", "must be at least 0 and less than shutdownTimeout (%v), got %v", c.ShutdownTimeout.Duration, d.Lameduck.Duration)
	}
	if ns, name, ok := strings.Cut(d.DNSService, "/"); !ok || ns == "" || name == "" {
		v.fail("dns.dnsService", "must be namespace/name, got %q", d.DNSService)
	}

	n := c.Node
	if slices.Contains(c.Roles, RoleNode) {
		v.nonEmpty("node.nodeName", n.NodeName)
	}
	for i, cidr := range n.ClusterCIDRs {
		if _, err := netip.ParsePrefix(cidr); err != nil {
			v.fail(fmt.Sprintf("node.clusterCIDRs[%d]", i), "must be a CIDR like 10.244.0.0/16, got %q", cidr)
		}
	}
	v.serviceCIDRs("node.serviceCIDRs", n.ServiceCIDRs)
	for i, a := range n.NodePortAddresses {
		if _, err := netip.ParsePrefix(a); err != nil && a != "primary" {
			v.fail(fmt.Sprintf("node.nodePortAddresses[%d]", i), "must be a CIDR or \"primary\", got %q", a)
		}
	}
	v.between("node.syncPeriod", n.SyncPeriod.Duration, time.Second, time.Hour)
	v.between("node.minSyncPeriod", n.MinSyncPeriod.Duration, 0, n.SyncPeriod.Duration)
	v.nonEmpty("node.cniConfDir", n.CNIConfDir)
	v.nonEmpty("node.cniBinDir", n.CNIBinDir)
	v.nonEmpty("node.ipamStateDir", n.IPAMStateDir)
	if !strings.HasPrefix(n.ProcSysDir, "/") {
		v.fail("node.procSysDir", "must be an absolute path like /proc/sys, got %q", n.ProcSysDir)
	}
	if n.Bridge == "" || len(n.Bridge) > 15 || strings.ContainsAny(n.Bridge, "/ \t") {
		v.fail("node.bridge", "must be an interface name of 1 to 15 characters, got %q", n.Bridge)
	}
	v.intRange("node.mtu", int(n.MTU), 0, 65535)
	if n.MTU != 0 && n.MTU < 576 {
		v.fail("node.mtu", "must be 0 (auto) or at least 576, got %d", n.MTU)
	}
	return errors.Join(v.errs...)
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

type validator struct{ errs []error }

func (v *validator) fail(field, format string, args ...any) {
	v.errs = append(v.errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
}

func (v *validator) intRange(field string, got, lo, hi int) {
	if got < lo || got > hi {
		v.fail(field, "must be between %d and %d, got %d", lo, hi, got)
	}
}

func (v *validator) between(field string, got, lo, hi time.Duration) {
	if got < lo || got > hi {
		v.fail(field, "must be between %v and %v, got %v", lo, hi, got)
	}
}

func (v *validator) nonEmpty(field, got string) {
	if got == "" {
		v.fail(field, "must not be empty")
	}
}

// hostPort checks a listen address; port 0 asks the kernel for a free port.
func (v *validator) hostPort(field, got string, mayBeEmpty bool) {
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
		v.fail(field, "must be host:port like 0.0.0.0:10290 (port 0 picks a free one), got %q", got)
	}
}

// serviceCIDRs accepts CIDRs, at most one per family, as the API server's
// --service-cluster-ip-range does.
func (v *validator) serviceCIDRs(field string, cidrs []string) {
	seen := map[bool]string{} // by "is IPv4"
	for i, c := range cidrs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			v.fail(fmt.Sprintf("%s[%d]", field, i), "must be a CIDR like 10.96.0.0/12, got %q", c)
			continue
		}
		if other, dup := seen[p.Addr().Is4()]; dup {
			v.fail(fmt.Sprintf("%s[%d]", field, i), "at most one CIDR per IP family: %q and %q are both IPv%s", other, c, map[bool]string{true: "4", false: "6"}[p.Addr().Is4()])
		}
		seen[p.Addr().Is4()] = c
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
