package node

import (
	"io"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/link"
	"github.com/netplane/netplane/nodeview"
	"github.com/netplane/netplane/overlay"
	"github.com/netplane/netplane/podnet"
	"github.com/netplane/netplane/policy"
	"github.com/netplane/netplane/proxy"
	"github.com/netplane/netplane/sweep"
	"github.com/netplane/netplane/wireguard"
)

// Cleanup removes from this node what the node role made, as kube-proxy's
// --cleanup does: each feature removes what it owns (its Cleanup), in the
// reverse order of their start, so the paths to other nodes go before
// the pod network. It reads the same configuration as the role, so it
// finds the same bridge, folders and key file. It writes what it removed
// to out and returns what could not be removed; what is missing is
// nothing to do, so a second run succeeds and removes nothing. keepIPAM
// keeps the plugin's IPAM store, for pods that outlive a reinstall.
func Cleanup(cfg v1alpha1.Node, keepIPAM bool, out io.Writer) error {
	h, err := link.Open()
	if err != nil {
		return err
	}
	defer h.Close()
	var s sweep.Sweep
	wireguard.Cleanup(&s, h, nodeview.SettingsOf(cfg).WireGuard.PrivateKeyFile)
	policy.Cleanup(&s)
	overlay.Cleanup(&s, h)
	podnet.Cleanup(&s, h, cfg, keepIPAM)
	proxy.Cleanup(&s)
	s.Report(out)
	return s.Err()
}
