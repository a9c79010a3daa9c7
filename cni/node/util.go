package node

import (
	"fmt"
	"net/netip"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
)

var everything = labels.Everything()

// typesUID is the UID kubelet uses in references to its Node: the name.
func typesUID(name string) types.UID { return types.UID(name) }

func parseCIDRs(ss []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range ss {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("%q is not a CIDR", s)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}
