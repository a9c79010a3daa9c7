package mirroring

//lint:file-ignore SA1019 mirroring reads the Endpoints API, deprecated since v1.33, by design: it exists for users who still write Endpoints.

import (
	"cmp"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// subset is a repacked Endpoints subset: addresses that offer exactly the
// same ports with the same readiness, ready ones first.
type subset struct {
	ports []corev1.EndpointPort
	addrs []readyAddr
}

type readyAddr struct {
	addr  corev1.EndpointAddress
	ready bool
}

// addrKey identifies an address across subsets: two pods may share an IP
// (hostNetwork), so the target's UID is part of it, as in the API server.
type addrKey struct {
	ip  string
	uid types.UID
}

// noPorts stands for the port set of a subset without ports, whose
// addresses must not be dropped.
var noPorts = corev1.EndpointPort{Port: -1}

// repack normalises subsets the way the API server does for Endpoints: an
// address listed in several subsets is merged; per port it is not ready if
// any subset says so; then addresses are grouped by the ports they offer.
func repack(in []corev1.EndpointSubset) []subset {
	addrs := map[addrKey]corev1.EndpointAddress{}
	var order []addrKey
	perPort := map[corev1.EndpointPort]map[addrKey]bool{}
	var portOrder []corev1.EndpointPort
	note := func(a corev1.EndpointAddress, port corev1.EndpointPort, ready bool) {
		k := addrKey{ip: a.IP}
		if a.TargetRef != nil {
			k.uid = a.TargetRef.UID
		}
		if _, ok := addrs[k]; !ok {
			addrs[k] = a
			order = append(order, k)
		}
		m := perPort[port]
		if m == nil {
			m = map[addrKey]bool{}
			perPort[port] = m
			portOrder = append(portOrder, port)
		}
		if was, seen := m[k]; !seen || was {
			m[k] = ready
		}
	}
	for _, s := range in {
		ports := s.Ports
		if len(ports) == 0 {
			ports = []corev1.EndpointPort{noPorts}
		}
		for _, port := range ports {
			for _, a := range s.Addresses {
				note(a, port, true)
			}
			for _, a := range s.NotReadyAddresses {
				note(a, port, false)
			}
		}
	}
	// Group ports by the exact (address, readiness) set that offers them.
	bySig := map[string]*subset{}
	var sigs []string
	for _, port := range portOrder {
		sig := signature(order, perPort[port])
		s := bySig[sig]
		if s == nil {
			s = &subset{addrs: readyAddrs(order, addrs, perPort[port])}
			bySig[sig] = s
			sigs = append(sigs, sig)
		}
		if port != noPorts {
			s.ports = append(s.ports, port)
		}
	}
	out := make([]subset, 0, len(sigs))
	for _, sig := range sigs {
		out = append(out, *bySig[sig])
	}
	return out
}

func signature(order []addrKey, m map[addrKey]bool) string {
	var b strings.Builder
	for _, k := range order {
		if ready, ok := m[k]; ok {
			b.WriteString(k.ip + "/" + string(k.uid) + "/" + strconv.FormatBool(ready) + ",")
		}
	}
	return b.String()
}

// readyAddrs lists the addresses of m, ready ones first, each part sorted by
// IP so that the plan does not depend on the order of the input.
func readyAddrs(order []addrKey, addrs map[addrKey]corev1.EndpointAddress, m map[addrKey]bool) []readyAddr {
	var out []readyAddr
	for _, k := range order {
		if ready, ok := m[k]; ok {
			out = append(out, readyAddr{addr: addrs[k], ready: ready})
		}
	}
	slices.SortStableFunc(out, func(a, b readyAddr) int {
		if a.ready != b.ready {
			if a.ready {
				return -1
			}
			return 1
		}
		return cmp.Compare(a.addr.IP, b.addr.IP)
	})
	return out
}
