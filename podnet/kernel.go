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
	"github.com/netplane/netplane/nodeview"
)

// kernel is what the pod network writes to the node's kernel and reads of
// it: the bridge, sysctls, and the underlay the pod MTU comes from. It is
// the seam between the planning and the kernel: hostKernel is netlink and
// the sysctl files; the tests' fakeKernel refuses what the kernel refuses,
// so the planning runs without root.
type kernel interface {
	nodeview.Underlay
	// EnsureBridge makes the bridge name exist and be up, with the
	// gateway addresses; a new bridge gets mtu (0: the kernel's default),
	// one that exists keeps its own.
	EnsureBridge(name string, mtu int, gateways []netip.Prefix) error
	// Sysctl writes value to key, a path under /proc/sys
	// (net/ipv4/ip_forward); a key the kernel does not have is an error
	// wrapping fs.ErrNotExist.
	Sysctl(key, value string) error
	// HasSysctl reports whether the kernel has key.
	HasSysctl(key string) bool
}

// hostKernel is the kernel h talks to, with its sysctls under procSys.
type hostKernel struct {
	nodeview.Underlay
	h       *netlink.Handle
	procSys string
}

func newHostKernel(h *netlink.Handle, procSys string) hostKernel {
	return hostKernel{Underlay: nodeview.KernelUnderlay(h), h: h, procSys: procSys}
}

func (k hostKernel) EnsureBridge(name string, mtu int, gateways []netip.Prefix) error {
	_, err := link.EnsureBridge(k.h, name, mtu, gateways)
	return err
}

func (k hostKernel) Sysctl(key, value string) error { return link.SysctlIn(k.procSys, key, value) }

// HasSysctl is false only when the file is missing: a sysctl that cannot
// be read for another reason is there, and its write says why it failed.
func (k hostKernel) HasSysctl(key string) bool {
	_, err := os.Stat(filepath.Join(k.procSys, key))
	return !errors.Is(err, fs.ErrNotExist)
}

// bridgeNetfilter are the sysctls that send bridged IPv4 and IPv6 traffic
// (pod to pod on this node) through netfilter: NetworkPolicy judges it
// there, and the proxy translates a pod's Service traffic to a pod on the
// same bridge there. They exist once the br_netfilter module is loaded.
var bridgeNetfilter = []string{"net/bridge/bridge-nf-call-iptables", "net/bridge/bridge-nf-call-ip6tables"}

// setUpNode makes the bridge with the gateway address of every pod CIDR and
// the pod MTU, and sets the sysctls the pod network needs; procSys names
// where they are in errors.
func setUpNode(k kernel, bridge, procSys string, mtu int, podCIDRs []netip.Prefix) error {
	var gws []netip.Prefix
	for _, p := range podCIDRs {
		gws = append(gws, netip.PrefixFrom(p.Addr().Next(), p.Bits()))
	}
	if err := k.EnsureBridge(bridge, mtu, gws); err != nil {
		return err
	}
	sysctls := [][2]string{{"net/ipv4/ip_forward", "1"}, {"net/ipv4/conf/" + bridge + "/route_localnet", "1"}}
	for _, p := range podCIDRs {
		if p.Addr().Is6() {
			sysctls = append(sysctls, [2]string{"net/ipv6/conf/all/forwarding", "1"})
		}
	}
	if err := haveBridgeNetfilter(k, procSys); err != nil {
		return err
	}
	for _, key := range bridgeNetfilter {
		sysctls = append(sysctls, [2]string{key, "1"})
	}
	for _, s := range sysctls {
		if err := k.Sysctl(s[0], s[1]); err != nil {
			return err
		}
	}
	return nil
}

// haveBridgeNetfilter says what to do when the bridge-netfilter sysctls
// are missing (under procSys, as the error says).
func haveBridgeNetfilter(k kernel, procSys string) error {
	for _, key := range bridgeNetfilter {
		if !k.HasSysctl(key) {
			return fmt.Errorf("sysctl %s is missing under %s: the br_netfilter kernel module is not loaded; load it on the node (modprobe br_netfilter, and list it in /etc/modules-load.d/ to load it at boot): bridged pod-to-pod traffic must pass netfilter for NetworkPolicy and Services", key, procSys)
		}
	}
	return nil
}
