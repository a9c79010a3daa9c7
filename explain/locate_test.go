package explain

import (
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/link"
	"github.com/netplane/netplane/nft"
	"github.com/netplane/netplane/nodeview"
	"github.com/netplane/netplane/overlay"
	"github.com/netplane/netplane/policy"
)

// nodeKernel is node n1's kernel as Locate reads it: the policy table,
// n1's address on eth0 of MTU 1500, no routes.
type nodeKernel struct{ Kernel }

func (nodeKernel) Table(id nft.TableID) (*nft.Table, error) {
	if id == policy.TableID {
		return nft.NewTable(id.Family, id.Name), nil
	}
	return nil, nil
}

func (nodeKernel) Addrs() ([]netip.Addr, error) {
	return []netip.Addr{netip.MustParseAddr("192.168.0.1")}, nil
}

func (nodeKernel) Routes() ([]netlink.Route, error)                    { return nil, nil }
func (nodeKernel) Underlays(nodeview.Node) ([]overlay.Underlay, error) { return nil, nil }
func (nodeKernel) DefaultRouteMTU() int                                { return 9000 }

func (nodeKernel) InterfaceOf(ip netip.Addr) (link.Interface, bool, error) {
	return link.Interface{Index: 2, Name: "eth0", MTU: 1500}, ip == netip.MustParseAddr("192.168.0.1"), nil
}

// TestExplainOnANodeShowsThePodMTUTheNodeRoleGivesIt: explain reads the
// node's underlay and takes the pod MTU from the same settings the node
// role runs with.
func TestExplainOnANodeShowsThePodMTUTheNodeRoleGivesIt(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  v1alpha1.Node
		want int
	}{
		{"VXLAN over IPv4", v1alpha1.Node{}, 1450},
		{"direct", v1alpha1.Node{Overlay: v1alpha1.Overlay{Mode: v1alpha1.OverlayNever}}, 1500},
		{"WireGuard", v1alpha1.Node{Encryption: v1alpha1.Encryption{Mode: v1alpha1.EncryptionWireGuard}}, 1440},
		{"--mtu", v1alpha1.Node{MTU: 1300, Encryption: v1alpha1.Encryption{Mode: v1alpha1.EncryptionWireGuard}}, 1300},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := &Input{Nodes: testNodes, Overlay: Overlay{Settings: nodeview.SettingsOf(tc.cfg)}}
			if err := Locate(nodeKernel{}, in); err != nil {
				t.Fatal(err)
			}
			if in.Here != "n1" || in.Overlay.PodMTU != tc.want {
				t.Errorf("on node %q, pod MTU %d; want n1 and %d", in.Here, in.Overlay.PodMTU, tc.want)
			}
		})
	}
}
