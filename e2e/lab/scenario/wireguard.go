package scenario

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/netplane/netplane/e2e/lab"
	"github.com/netplane/netplane/e2e/netns"
)

// marker is sent by the client pod in its requests to pods of other nodes.
const marker = "netplane-lab-cleartext-marker"

// Encrypted: with the node agents' WireGuard on, a capture of every link
// of the underlay (both subnets and the router between them) while the
// client pod sends a marker to every nginx pod, by its address and through
// the ClusterIP, sees WireGuard's UDP and never the marker nor a packet
// to or from a pod address. Without encryption it is skipped.
func Encrypted(ctx context.Context, l *lab.Lab, logf func(string, ...any)) error {
	if l.Config.Encryption != "wireguard" {
		return Skipped{"encryption is off (NETPLANE_LAB_ENCRYPTION unset)"}
	}
	return noClearTraffic(ctx, l, logf)
}

// noClearTraffic captures the underlay while the client pod sends the
// marker to every nginx pod and the ClusterIP, and fails on anything in
// clear.
func noClearTraffic(ctx context.Context, l *lab.Lab, logf func(string, ...any)) error {
	pods, ip, err := clusterIPExample(ctx, l)
	if err != nil {
		return err
	}
	caps, err := captureUnderlay(l)
	if err != nil {
		return err
	}
	urls := []string{"http://" + net.JoinHostPort(ip, "8080") + "/?m=" + marker}
	for _, p := range pods {
		urls = append(urls, "http://"+net.JoinHostPort(p.Status.PodIP, "80")+"/?m="+marker)
	}
	var errs []error
	for _, u := range urls {
		for range 3 {
			if _, err := get(ctx, l, "client", u); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", u, err))
				break
			}
		}
	}
	stopAll(caps)
	// The wire is checked also when a request failed: a failure may be a
	// packet that went out in clear.
	return errors.Join(append([]error{checkNoClear(caps, l.Config, logf)}, errs...)...)
}

// captureUnderlay captures on every link of the underlay namespace but its
// bridges: a bridge's own socket sees only what is addressed to it.
func captureUnderlay(l *lab.Lab) ([]*netns.Capture, error) {
	var names []string
	err := l.Underlay.Do(func() error {
		ifs, err := net.Interfaces()
		for _, i := range ifs {
			if i.Name != "lo" && !strings.HasPrefix(i.Name, "underlay") {
				names = append(names, i.Name)
			}
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	var caps []*netns.Capture
	for _, n := range names {
		c, err := l.Underlay.StartCapture(n)
		if err != nil {
			stopAll(caps)
			return nil, err
		}
		caps = append(caps, c)
	}
	return caps, nil
}

func stopAll(caps []*netns.Capture) {
	for _, c := range caps {
		c.Stop()
	}
}

// checkNoClear fails on a frame holding the marker or a pod address, and
// when no WireGuard packet of the lab's primary family was seen (a capture
// that saw nothing, or tunnels between addresses the nodes are not known
// by: in an IPv6 lab WireGuard runs over the IPv6 underlay).
func checkNoClear(caps []*netns.Capture, c lab.Config, logf func(string, ...any)) error {
	var pods []netip.Prefix
	for _, cidr := range strings.Split(c.ClusterCIDRs(), ",") {
		pods = append(pods, netip.MustParsePrefix(cidr))
	}
	inPods := func(ip net.IP) bool {
		a, ok := netip.AddrFromSlice(ip)
		for _, p := range pods {
			if ok && p.Contains(a.Unmap()) {
				return true
			}
		}
		return false
	}
	underlay, family := uint16(netns.EtherIPv4), "IPv4"
	if c.IPv6() {
		underlay, family = netns.EtherIPv6, "IPv6"
	}
	frames, wg, wgPrimary := 0, 0, 0
	for _, c := range caps {
		for _, f := range c.Frames() {
			frames++
			p := netns.Parse(f)
			if bytes.Contains(f, []byte(marker)) {
				return fmt.Errorf("%s: the marker crossed in clear in %s", c.Ifname, p)
			}
			if inPods(p.Src) || inPods(p.Dst) {
				return fmt.Errorf("%s: %s crossed with a pod address in clear", c.Ifname, p)
			}
			if p.Proto == netns.ProtoUDP && (p.DstPort == 51820 || p.SrcPort == 51820) {
				wg++
				if p.EtherType == underlay {
					wgPrimary++
				}
			}
		}
	}
	if wgPrimary == 0 {
		return fmt.Errorf("no WireGuard packet over the %s underlay among %d frames on %d links (%d of WireGuard in all)", family, frames, len(caps), wg)
	}
	logf("%d frames on %d underlay links: %d of WireGuard, %d of them over %s, no marker, no pod address", frames, len(caps), wg, wgPrimary, family)
	return nil
}
