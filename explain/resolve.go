package explain

import (
	"net/netip"
	"strconv"
	"strings"

	mdns "github.com/miekg/dns"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/netplane/netplane/dns"
)

// defaultNdots is the kubelet's ndots for ClusterFirst pods.
const defaultNdots = 5

// SearchPath is the search list and ndots of a pod's resolv.conf as the
// kubelet writes it for ClusterFirst pods (hostNetwork ones need
// ClusterFirstWithHostNet), with spec.dnsConfig's additions; ok is false
// when the pod does not use the cluster's DNS.
func SearchPath(pod *v1.Pod, clusterDomain string) (search []string, ndots int, ok bool) {
	zone := strings.TrimSuffix(clusterDomain, ".")
	ndots = defaultNdots
	switch pod.Spec.DNSPolicy {
	case v1.DNSClusterFirst, "":
		ok = !pod.Spec.HostNetwork
	case v1.DNSClusterFirstWithHostNet:
		ok = true
	case v1.DNSNone:
		ok, ndots = true, 1 // only what dnsConfig says; glibc's default ndots
	}
	if ok && pod.Spec.DNSPolicy != v1.DNSNone {
		search = []string{pod.Namespace + ".svc." + zone, "svc." + zone, zone}
	}
	if c := pod.Spec.DNSConfig; c != nil {
		search = append(search, c.Searches...)
		for _, o := range c.Options {
			if o.Name == "ndots" && o.Value != nil {
				if n, err := strconv.Atoi(*o.Value); err == nil && n >= 0 {
					ndots = min(n, 15) // glibc's cap
				}
			}
		}
	}
	return search, ndots, ok
}

// Candidates are the names a glibc resolver asks, in order: a name with
// a final dot as is; one with at least ndots dots as is first, then with
// each search domain; any other with each search domain first.
func Candidates(name string, search []string, ndots int) []string {
	if strings.HasSuffix(name, ".") {
		return []string{strings.ToLower(name)}
	}
	name = strings.ToLower(name)
	var out []string
	for _, s := range search {
		out = append(out, name+"."+strings.TrimSuffix(strings.ToLower(s), ".")+".")
	}
	if strings.Count(name, ".") >= ndots {
		return append([]string{name + "."}, out...)
	}
	return append(out, name+".")
}

// ServicesNamed are the Services the candidates in the zone could name
// (NAME.NAMESPACE.svc.ZONE, and the endpoint form HOST.NAME.NAMESPACE.svc.ZONE):
// what the shell fetches to answer them.
func ServicesNamed(candidates []string, zone *dns.Zone) []types.NamespacedName {
	var out []types.NamespacedName
	for _, c := range candidates {
		if !zone.InZone(c) {
			continue
		}
		ls := mdns.SplitDomainName(strings.TrimSuffix(c[:len(c)-len(zone.Origin)], "."))
		if n := len(ls); n >= 3 && ls[n-1] == "svc" {
			out = append(out, types.NamespacedName{Namespace: ls[n-2], Name: ls[n-3]})
		}
	}
	return out
}

// Resolve asks the candidates in order of the DNS role's answer logic over
// ix, as the pod's resolver would, and stops at the first with addresses.
// Names outside the zone go upstream, which explain does not ask.
func Resolve(zone *dns.Zone, ix *dns.Index, name string, candidates []string, search []string, ndots int, v6 bool) *Resolution {
	r := &Resolution{Name: name, Search: search, Ndots: ndots}
	qtype := mdns.TypeA
	if v6 {
		qtype = mdns.TypeAAAA
	}
	for _, c := range candidates {
		if !zone.InZone(c) {
			r.Tried = append(r.Tried, Query{Name: c, Rcode: "upstream"})
			continue
		}
		res := zone.Answer(ix, mdns.Question{Name: c, Qtype: qtype, Qclass: mdns.ClassINET})
		q := Query{Name: c, Rcode: mdns.RcodeToString[res.Rcode]}
		var first netip.Addr
		for _, rr := range res.Answer {
			q.Answer = append(q.Answer, strings.ReplaceAll(rr.String(), "\t", " "))
			switch a := rr.(type) {
			case *mdns.A:
				if ip, ok := netip.AddrFromSlice(a.A.To4()); ok && !first.IsValid() {
					first = ip
				}
			case *mdns.AAAA:
				if ip, ok := netip.AddrFromSlice(a.AAAA); ok && !first.IsValid() {
					first = ip
				}
			}
		}
		r.Tried = append(r.Tried, q)
		if first.IsValid() {
			r.Address = first.Unmap().String()
			return r
		}
		if res.Rcode != mdns.RcodeNameError && res.Rcode != mdns.RcodeSuccess {
			return r // SERVFAIL, REFUSED: the resolver gives up
		}
	}
	return r
}
