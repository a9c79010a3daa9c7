package lab

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
)

// The lab's address families (Config.Family, $NETPLANE_LAB_IP_FAMILY). The
// underlay is always dual-stack; the family decides what the cluster gets:
// its service and pod CIDRs, the nodes' InternalIPs, the API server's
// advertised address, the cluster DNS Service and the upstream resolver.
const (
	FamilyDual = "dual" // IPv4 first, then IPv6: the default
	FamilyIPv4 = "ipv4"
	FamilyIPv6 = "ipv6"
)

// The cluster's addresses of each family.
const (
	serviceCIDR4, serviceCIDR6 = "10.96.0.0/16", "fd00:10:96::/112"
	clusterCIDR4, clusterCIDR6 = "10.244.0.0/16", "fd00:10:244::/56"
	dnsServiceIP6              = "fd00:10:96::a"
	UpstreamDNSIP6             = "fd00:172:30::53"
)

func (c *Config) completeFamily() error {
	if c.Family == "" {
		c.Family = os.Getenv("NETPLANE_LAB_IP_FAMILY")
	}
	switch c.Family {
	case "":
		c.Family = FamilyDual
	case FamilyDual, FamilyIPv4, FamilyIPv6:
	default:
		return fmt.Errorf("unknown IP family %q (NETPLANE_LAB_IP_FAMILY): %s, %s or %s", c.Family, FamilyDual, FamilyIPv4, FamilyIPv6)
	}
	return nil
}

// pick is v4 and v6 as the family has them, the primary first.
func (c Config) pick(v4, v6 string) []string {
	switch c.Family {
	case FamilyIPv4:
		return []string{v4}
	case FamilyIPv6:
		return []string{v6}
	}
	return []string{v4, v6}
}

// first is the primary family's one of v4 and v6.
func (c Config) first(v4, v6 string) string { return c.pick(v4, v6)[0] }

// ServiceCIDRs and ClusterCIDRs are the cluster's, comma-separated.
func (c Config) ServiceCIDRs() string { return strings.Join(c.pick(serviceCIDR4, serviceCIDR6), ",") }
func (c Config) ClusterCIDRs() string { return strings.Join(c.pick(clusterCIDR4, clusterCIDR6), ",") }

// DNSServiceIP is the cluster DNS Service's ClusterIP (the kubelets'
// clusterDNS).
func (c Config) DNSServiceIP() string { return c.first(DNSServiceIP, dnsServiceIP6) }

// APIServerIP is the address the API server advertises.
func (c Config) APIServerIP() string { return c.first(ControlPlaneIP, ControlPlaneIP6) }

// APIServerURL is the API server's address as hosts in the lab reach it
// (the chart's node.controlPlaneEndpoint in the lab).
func (c Config) APIServerURL() string {
	return "https://" + net.JoinHostPort(c.APIServerIP(), strconv.Itoa(APIPort))
}

// UpstreamDNS is the resolver the nodes' resolv.conf names.
func (c Config) UpstreamDNS() string { return c.first(UpstreamDNSIP, UpstreamDNSIP6) }

// NodeIPs are node n's InternalIPs (the kubelet's --node-ip).
func (c Config) NodeIPs(n *Node) string { return strings.Join(c.pick(n.IP, n.IP6), ",") }

// PrimaryIP is node n's InternalIP of the primary family.
func (c Config) PrimaryIP(n *Node) string { return c.first(n.IP, n.IP6) }

// IPv6 says whether the cluster's primary family is IPv6.
func (c Config) IPv6() bool { return c.Family == FamilyIPv6 }

// ExternalClientIP is the external client's underlay address of the
// primary family: the source a Service with externalTrafficPolicy Local
// keeps.
func (c Config) ExternalClientIP() string { return c.first(ExternalIP, ExternalIP6) }
