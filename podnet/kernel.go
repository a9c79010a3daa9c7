package podnet

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/vishvananda/netlink"

	"github.com/netplane/netplane/link"
)

// bridgeNetfilter are the sysctls that send bridged IPv4 and IPv6 traffic
// (pod to pod on this node) through netfilter: NetworkPolicy judges it
// there, and the proxy translates a pod's Service traffic to a pod on the
// same bridge there. They exist once the br_netfilter module is loaded.
var bridgeNetfilter = []string{"net/bridge/bridge-nf-call-iptables", "net/bridge/bridge-nf-call-ip6tables"}

// setUpNode makes the bridge with the gateway address of every pod CIDR and
// the pod MTU, and sets the sysctls the pod network needs under procSys.
func setUpNode(h *netlink.Handle, bridge, procSys string, mtu int, podCIDRs []netip.Prefix) error {
	var gws []netip.Prefix
	for _, p := range podCIDRs {
		gws = append(gws, netip.PrefixFrom(p.Addr().Next(), p.Bits()))
	}
	if _, err := link.EnsureBridge(h, bridge, mtu, gws); err != nil {
		return err
	}
	sysctls := [][2]string{{"net/ipv4/ip_forward", "1"}, {"net/ipv4/conf/" + bridge + "/route_localnet", "1"}}
	for _, p := range podCIDRs {
		if p.Addr().Is6() {
			sysctls = append(sysctls, [2]string{"net/ipv6/conf/all/forwarding", "1"})
		}
	}
	if err := haveBridgeNetfilter(procSys); err != nil {
		return err
	}
	for _, key := range bridgeNetfilter {
		sysctls = append(sysctls, [2]string{key, "1"})
	}
	for _, s := range sysctls {
		if err := link.SysctlIn(procSys, s[0], s[1]); err != nil {
			return err
		}
	}
	return nil
}

// haveBridgeNetfilter says what to do when the bridge-netfilter sysctls
// are missing under procSys.
func haveBridgeNetfilter(procSys string) error {
	for _, key := range bridgeNetfilter {
		if _, err := os.Stat(filepath.Join(procSys, key)); errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("sysctl %s is missing under %s: the br_netfilter kernel module is not loaded; load it on the node (modprobe br_netfilter, and list it in /etc/modules-load.d/ to load it at boot): bridged pod-to-pod traffic must pass netfilter for NetworkPolicy and Services", key, procSys)
		}
	}
	return nil
}
