package scenario

import (
	"context"
	"fmt"
	"slices"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netplane/netplane/e2e/lab"
)

// The scenarios speak the lab's primary family (NETPLANE_LAB_IP_FAMILY):
// its Services' ClusterIPs, pod IPs and node addresses are of that family,
// and so are the addresses and records they check.

// Addresses the external-traffic scenarios use, by family; the lab's
// underlay routes them to a node, as a router in front of a real cluster
// would.
var (
	externalIPAddrs   = [2]string{ExternalIPAddr, "fd00:172:30:1::10"}
	loadBalancerAddrs = [2]string{LoadBalancerAddr, "fd00:172:30:1::20"}
	// What the lab's fake upstream answers for names under example.
	upstreamAnswers = [2]string{"192.0.2.10", "2001:db8::10"}
)

// primary is 0 for a lab whose primary family is IPv4, 1 for IPv6.
func primary(l *lab.Lab) int {
	if l.Config.IPv6() {
		return 1
	}
	return 0
}

// addressType is the EndpointSlice address type of the primary family.
func addressType(l *lab.Lab) discoveryv1.AddressType {
	return [2]discoveryv1.AddressType{discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6}[primary(l)]
}

// addressRecord is the DNS record type of the primary family.
func addressRecord(l *lab.Lab) string { return [2]string{"A", "AAAA"}[primary(l)] }

// nodeIP is node n's InternalIP of the primary family.
func nodeIP(l *lab.Lab, n *lab.Node) string { return l.Config.PrimaryIP(n) }

// setExternalIP gives a Service of the examples, written with an IPv4
// externalIP, the lab's own of its family.
func setExternalIP(ctx context.Context, l *lab.Lab, service, addr string) error {
	c := l.Client.CoreV1().Services("default")
	svc, err := c.Get(ctx, service, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if slices.Equal(svc.Spec.ExternalIPs, []string{addr}) {
		return nil
	}
	svc.Spec.ExternalIPs = []string{addr}
	if _, err := c.Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("externalIP %s of %s: %w", addr, service, err)
	}
	return nil
}
