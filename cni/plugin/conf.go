// Package plugin is the netplane-cni plugin: one function per CNI verb
// (ADD, DEL, CHECK, STATUS, GC) that gives a pod a veth on the node bridge
// and addresses from the node's pod CIDRs. It keeps no Kubernetes client:
// cmd/netplane-cni links it into the small binary every pod start executes.
package plugin

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/netplane/netplane/cni/conflist"
	"github.com/netplane/netplane/cni/ipam"
)

// NetConf is the plugin's configuration: the conflist entry the node agent
// writes, with what the runtime adds, and the pod CIDRs parsed.
type NetConf struct {
	conflist.Plugin

	ranges    []netip.Prefix
	rangesErr error // kept for ADD and STATUS; DEL and GC work without ranges
}

// parseConf decodes and validates stdin; the error is a coded CNI error.
func parseConf(data []byte) (*NetConf, error) {
	c := &NetConf{Plugin: conflist.Plugin{Bridge: "cni0"}}
	if err := json.Unmarshal(data, c); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "cannot decode the network configuration", err.Error())
	}
	if c.IPAM.Type != "" {
		return nil, types.NewError(types.ErrUnsupportedField, fmt.Sprintf("unsupported field ipam.type=%q", c.IPAM.Type),
			"netplane-cni allocates pod addresses itself from podCIDRs: remove the ipam section")
	}
	if c.StateDir == "" {
		return nil, invalidConf("stateDir is empty: set it to the IPAM state directory (netplane --ipam-state-dir)")
	}
	if c.Bridge == "" || len(c.Bridge) > 15 || strings.ContainsAny(c.Bridge, "/ :") {
		return nil, invalidConf(fmt.Sprintf("bridge %q is not a valid interface name", c.Bridge))
	}
	if c.MTU != 0 && (c.MTU < 68 || c.MTU > 65535) {
		return nil, invalidConf(fmt.Sprintf("mtu %d is out of range (68 to 65535)", c.MTU))
	}
	c.rangesErr = c.parseRanges()
	return c, nil
}

func (c *NetConf) parseRanges() error {
	seen := map[bool]bool{}
	for _, s := range c.PodCIDRs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return invalidConf(fmt.Sprintf("podCIDRs: %q is not a CIDR", s))
		}
		if err := ipam.ValidateRange(p); err != nil {
			return invalidConf("podCIDRs: " + err.Error())
		}
		if seen[p.Addr().Is4()] {
			return invalidConf(fmt.Sprintf("podCIDRs %v has two CIDRs of one family: give at most one IPv4 and one IPv6", c.PodCIDRs))
		}
		seen[p.Addr().Is4()] = true
		c.ranges = append(c.ranges, p)
	}
	return nil
}

// requireMTU is for ADD, which sizes the pod's interfaces: the MTU is the
// node role's to decide (nodeview.Settings.PodMTU), never the plugin's.
func (c *NetConf) requireMTU() error {
	if c.MTU == 0 {
		return invalidConf("mtu is missing: netplane --role=node writes the node's pod MTU into the conflist")
	}
	return nil
}

// requireRanges is for the verbs that need a pod CIDR (ADD, STATUS).
func (c *NetConf) requireRanges() error {
	if c.rangesErr != nil {
		return c.rangesErr
	}
	if len(c.ranges) == 0 {
		return invalidConf("podCIDRs is empty: the node has no pod CIDR yet; netplane --role=node writes it once the Node has spec.podCIDRs")
	}
	return nil
}

// requested collects the addresses the runtime asked for (runtimeConfig.ips,
// args.cni.ips, CNI_ARGS IP=a,b).
func (c *NetConf) requested(cniArgs string) ([]netip.Addr, error) {
	raw := append(append([]string{}, c.RuntimeConfig.IPs...), c.Args.CNI.IPs...)
	for _, kv := range strings.Split(cniArgs, ";") {
		if k, v, ok := strings.Cut(kv, "="); ok && k == "IP" {
			raw = append(raw, strings.Split(v, ",")...)
		}
	}
	var out []netip.Addr
	for _, s := range raw {
		// Runtimes send "10.0.0.5" or "10.0.0.5/24"; only the address matters.
		s, _, _ = strings.Cut(s, "/")
		a, err := netip.ParseAddr(strings.TrimSpace(s))
		if err != nil {
			return nil, invalidConf(fmt.Sprintf("requested IP %q is not an IP address", s))
		}
		out = append(out, a)
	}
	return out, nil
}

// portMappings validates the portMappings capability.
func (c *NetConf) portMappings() ([]ipam.PortMapping, error) {
	var out []ipam.PortMapping
	for _, e := range c.RuntimeConfig.PortMappings {
		proto := strings.ToLower(e.Protocol)
		if proto == "" {
			proto = "tcp"
		}
		if proto != "tcp" && proto != "udp" {
			return nil, types.NewError(types.ErrUnsupportedField, fmt.Sprintf("unsupported portMappings protocol %q", e.Protocol), "use tcp or udp")
		}
		if e.HostPort < 1 || e.HostPort > 65535 || e.ContainerPort < 1 || e.ContainerPort > 65535 {
			return nil, invalidConf(fmt.Sprintf("portMappings entry %d->%d has a port outside 1-65535", e.HostPort, e.ContainerPort))
		}
		m := ipam.PortMapping{HostPort: uint16(e.HostPort), ContainerPort: uint16(e.ContainerPort), Protocol: proto}
		if e.HostIP != "" && e.HostIP != "0.0.0.0" && e.HostIP != "::" {
			a, err := netip.ParseAddr(e.HostIP)
			if err != nil {
				return nil, invalidConf(fmt.Sprintf("portMappings hostIP %q is not an IP address", e.HostIP))
			}
			m.HostIP = a
		}
		out = append(out, m)
	}
	return out, nil
}

// prevResult decodes prevResult, which only CHECK reads: DEL gets it too,
// and decoding it there would be work on every pod stop. It is nil when the
// runtime sent none.
func (c *NetConf) prevResult() (types.Result, error) {
	if c.RawPrevResult == nil {
		return nil, nil
	}
	std := &types.PluginConf{CNIVersion: c.CNIVersion, RawPrevResult: c.RawPrevResult}
	if err := version.ParsePrevResult(std); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "cannot decode prevResult", err.Error())
	}
	return std.PrevResult, nil
}

func invalidConf(msg string) error {
	return types.NewError(types.ErrInvalidNetworkConfig, msg, "")
}

// gateways are the bridge's addresses: the first address of each pod CIDR.
func (c *NetConf) gateways() []netip.Prefix {
	var out []netip.Prefix
	for _, r := range c.ranges {
		out = append(out, netip.PrefixFrom(ipam.Gateway(r), r.Bits()))
	}
	return out
}
