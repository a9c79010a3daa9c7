package v1alpha1

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// ValidateForwarding checks where names outside the cluster domain go,
// wherever the settings come from (the file, the kube-dns ConfigMap):
// every server an IP or IP:port, every stub domain a DNS name with at
// least one server and outside the cluster domain, which netplane answers
// itself whatever a stub domain says.
func ValidateForwarding(clusterDomain string, stubs map[string][]string, upstreams []string, stubsPath, upstreamsPath *field.Path) field.ErrorList {
	v := &validator{}
	for i, u := range upstreams {
		if !validUpstream(u) {
			v.invalid(upstreamsPath.Index(i), u, "must be an IP address or IP:port")
		}
	}
	cluster := StubDomain(clusterDomain)
	seen := map[string]string{}
	for _, d := range slices.Sorted(maps.Keys(stubs)) {
		p, norm := stubsPath.Key(d), StubDomain(d)
		switch {
		case norm == ".":
			v.invalid(p, field.OmitValueType{}, "the root is no stub domain: list its servers in upstreamServers")
		case !validDomain(strings.TrimSuffix(norm, ".")):
			v.invalid(p, field.OmitValueType{}, "must be a DNS name like corp.example")
		case norm == cluster || strings.HasSuffix(norm, "."+cluster):
			v.invalid(p, field.OmitValueType{}, fmt.Sprintf("is inside the cluster domain %s, which netplane answers itself: forward a domain outside it", clusterDomain))
		case seen[norm] != "":
			v.invalid(p, field.OmitValueType{}, fmt.Sprintf("names the same domain as %q", seen[norm]))
		}
		seen[norm] = d
		if len(stubs[d]) == 0 {
			v.invalid(p, field.OmitValueType{}, "must list at least one server (IP or IP:port)")
		}
		for i, s := range stubs[d] {
			if !validUpstream(s) {
				v.invalid(p.Index(i), s, "must be an IP address or IP:port")
			}
		}
	}
	return v.errs
}

// StubDomain is a domain as the forwarder keys it: lowercase, with the
// root's trailing dot.
func StubDomain(d string) string {
	return strings.TrimSuffix(strings.ToLower(strings.TrimSpace(d)), ".") + "."
}
