package podnet

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/netplane/netplane/nodeview"
)

// TestSetUpNodeOnTheFakeKernel plans and applies a node's setup (the pod
// MTU from the underlay, the bridge, the sysctls) on the fake kernel,
// without root; each case starts on a fresh node with eth0 (MTU 9000)
// holding the Node's IPv4 InternalIP (so the IPv4 VXLAN overhead), and
// the overlay may tunnel.
func TestSetUpNodeOnTheFakeKernel(t *testing.T) {
	v4 := prefixes("10.244.0.0/24")
	dual := prefixes("10.244.0.0/24", "fd00:10:244::/64")
	for _, tc := range []struct {
		name     string
		prepare  func(*fakeKernel)
		bridge   string
		podCIDRs []netip.Prefix
		twice    bool   // the sync runs twice
		wantErr  string // a part of the error; "" for none
		want     string // the bridge, as fakeState says it
	}{
		{"a fresh node", nil, "cni0", dual, false, "",
			"bridge up mtu 8950 [10.244.0.1/24 fd00:10:244::1/64] ip_forward=1 route_localnet=1 ipv6_forwarding=1 bridge-nf=1,1"},
		{"IPv4 pods only: no IPv6 forwarding", nil, "cni0", v4, false, "",
			"bridge up mtu 8950 [10.244.0.1/24] ip_forward=1 route_localnet=1 ipv6_forwarding=0 bridge-nf=1,1"},
		{"the second sync finds it done", nil, "cni0", dual, true, "",
			"bridge up mtu 8950 [10.244.0.1/24 fd00:10:244::1/64] ip_forward=1 route_localnet=1 ipv6_forwarding=1 bridge-nf=1,1"},
		{"an existing bridge keeps its MTU and gets the gateways", func(k *fakeKernel) { k.addLink("cni0", "bridge", 1500) }, "cni0", v4, false, "",
			"bridge up mtu 1500 [10.244.0.1/24] ip_forward=1 route_localnet=1 ipv6_forwarding=0 bridge-nf=1,1"},
		{"br_netfilter not loaded", func(k *fakeKernel) {
			for _, key := range bridgeNetfilter {
				delete(k.sysctls, key)
			}
		}, "cni0", v4, false, "modprobe br_netfilter", ""},
		{"the name held by a veth", func(k *fakeKernel) { k.addLink("cni0", "veth", 1500) }, "cni0", v4, false, "is a veth, not a bridge", ""},
		{"a name the kernel does not take", nil, "netplane-bridge0", v4, false, "invalid argument", ""},
		{"an underlay too small for the overlay", func(k *fakeKernel) { k.links["eth0"].mtu = 100 }, "cni0", v4, false, "invalid argument", ""},
		{"IPv6 disabled on the node", func(k *fakeKernel) { k.sysctls["net/ipv6/conf/default/disable_ipv6"] = "1" }, "cni0", dual, false,
			"add gateway fd00:10:244::1/64 to bridge cni0: permission denied", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := newFakeKernel()
			k.addLink("eth0", "veth", 9000, netip.MustParsePrefix("192.168.1.10/24"))
			if tc.prepare != nil {
				tc.prepare(k)
			}
			self := nodeview.Node{Name: "self", IPs: []netip.Addr{netip.MustParseAddr("192.168.1.10")}, PodCIDRs: tc.podCIDRs}
			var err error
			for range 1 + btoi(tc.twice) {
				var underlay int
				if underlay, err = nodeview.UnderlayMTU(k, self); err == nil {
					err = setUpNode(k, tc.bridge, "/proc/sys", nodeview.Settings{}.PodMTU(underlay, self), self.PodCIDRs)
				}
			}
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("error %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("error %v, want one saying %q", err, tc.wantErr)
			case tc.wantErr == "":
				if got := fakeState(k, tc.bridge); got != tc.want {
					t.Errorf("the node is\n%s\nwant\n%s", got, tc.want)
				}
			}
		})
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// fakeState describes the bridge and the sysctls setUpNode writes.
func fakeState(k *fakeKernel, bridge string) string {
	br, ok := k.links[bridge]
	if !ok {
		return "no bridge"
	}
	addrs := slices.Clone(br.addrs)
	slices.SortFunc(addrs, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	up := "down"
	if br.up {
		up = "up"
	}
	s := k.sysctls
	return fmt.Sprintf("%s %s mtu %d %v ip_forward=%s route_localnet=%s ipv6_forwarding=%s bridge-nf=%s,%s", br.kind, up, br.mtu, addrs,
		s["net/ipv4/ip_forward"], s["net/ipv4/conf/"+bridge+"/route_localnet"], s["net/ipv6/conf/all/forwarding"],
		s[bridgeNetfilter[0]], s[bridgeNetfilter[1]])
}
