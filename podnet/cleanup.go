package podnet

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/cni/conflist"
	"github.com/netplane/netplane/cni/ipam"
	"github.com/netplane/netplane/link"
	"github.com/netplane/netplane/nft"
	"github.com/netplane/netplane/sweep"
)

// HostPortTable is the CNI plugin's table of hostPorts.
var HostPortTable = nft.TableID{Family: nftables.TableFamilyINet, Name: conflist.HostPortTable}

// Cleanup removes what the pod network made in h's namespace and in the
// folders of cfg, for `netplane --role=node --cleanup`: the masquerade
// table, the conflist and the plugin first, so that no runtime starts a
// pod on the way out; then what the plugin made for pods (the host ends
// of their veths, the hostPort table), the bridge, and, unless keepIPAM,
// the plugin's IPAM store. The sysctls it set stay: others may rely on
// forwarding.
func Cleanup(s *sweep.Sweep, h *netlink.Handle, cfg v1alpha1.Node, keepIPAM bool) {
	s.Table(MasqTable)
	s.File(filepath.Join(cfg.CNIConfDir, ConflistName))
	s.File(filepath.Join(cfg.CNIBinDir, conflist.Type))
	links, err := link.Retry(h.LinkList)
	if err != nil {
		s.Note("pod veths", fmt.Errorf("list links: %w", err))
	}
	for _, l := range links {
		if name := l.Attrs().Name; l.Type() == "veth" && strings.HasPrefix(name, conflist.VethPrefix) {
			s.Link(h, name, "veth")
		}
	}
	s.Table(HostPortTable)
	s.Link(h, cfg.Bridge, "bridge")
	files, err := ipam.Files(cfg.IPAMStateDir)
	switch {
	case err != nil:
		s.Note("IPAM store "+cfg.IPAMStateDir, err)
	case keepIPAM && len(files) > 0:
		s.Keep("IPAM store "+cfg.IPAMStateDir, "kept as asked (--cleanup-keep-ipam)")
	case !keepIPAM:
		for _, f := range files {
			s.File(f)
		}
		s.Dir(cfg.IPAMStateDir)
	}
}
