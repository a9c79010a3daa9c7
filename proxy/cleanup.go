package proxy

import "github.com/netplane/netplane/sweep"

// Cleanup removes the proxy's tables, ip and ip6 netplane, for
// `netplane --role=node --cleanup`. Conntrack entries of Services are the
// kernel's and age out; the sysctls it set stay, as kube-proxy's do.
func Cleanup(s *sweep.Sweep) {
	for _, id := range tableIDs() {
		s.Table(id)
	}
}
