// Package mirroring is netplane's EndpointSlice mirroring controller: for a
// Service without a selector whose Endpoints object a user (or another
// controller) writes by hand, it publishes the same addresses as
// EndpointSlices, so that consumers which read only slices (kube-proxy,
// CoreDNS, netplane's own proxy and DNS) see them. It matches
// kube-controller-manager's endpointslicemirroring controller.
//
// plan.go is the pure core: Endpoints + the slices mirrored so far → the
// writes that make them equal. controller.go is the shell around it.
package mirroring

//lint:file-ignore SA1019 mirroring reads the Endpoints API, deprecated since v1.33, by design: it exists for users who still write Endpoints.

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	esutil "k8s.io/endpointslice/util"
)

// ControllerName is the managed-by value of mirrored slices, the same as
// kube-controller-manager's so consumers treat them identically.
const ControllerName = "endpointslicemirroring-controller.k8s.io"

// Plan is the set of writes that converge the mirrored slices.
type Plan struct {
	Create, Update, Delete []*discovery.EndpointSlice
	// Skipped counts addresses over the per-subset limit; Invalid counts
	// addresses that are not IPs. Neither is mirrored.
	Skipped, Invalid int
}

// Writes is the number of API writes the plan makes.
func (p Plan) Writes() int { return len(p.Create) + len(p.Update) + len(p.Delete) }

// group is one desired slice: a port set and address family, and the
// endpoints that offer exactly those ports.
type group struct {
	key       string
	family    discovery.AddressType
	ports     []discovery.EndpointPort
	endpoints []discovery.Endpoint
}

// Compute plans the slices mirroring ep, given the slices mirrored for it so
// far, with at most maxPerSubset addresses taken from each subset.
func Compute(ep *corev1.Endpoints, existing []*discovery.EndpointSlice, maxPerSubset int) Plan {
	var p Plan
	desired := desiredGroups(ep, maxPerSubset, &p)
	byKey := map[string][]*discovery.EndpointSlice{}
	for _, s := range existing {
		k := sliceKey(s.AddressType, s.Ports)
		byKey[k] = append(byKey[k], s)
	}
	for _, g := range desired {
		have := byKey[g.key]
		delete(byKey, g.key)
		if len(have) > 0 {
			p.Delete = append(p.Delete, have[1:]...)
			if upToDate(ep, have[0], g) {
				continue
			}
			s := newSlice(ep, g)
			s.Name, s.GenerateName = have[0].Name, ""
			p.Update = append(p.Update, s)
			continue
		}
		p.Create = append(p.Create, newSlice(ep, g))
	}
	for _, k := range slices.Sorted(maps.Keys(byKey)) {
		p.Delete = append(p.Delete, byKey[k]...)
	}
	recycle(&p)
	return p
}

// desiredGroups repacks the subsets (an address offering the same ports
// in several subsets is one endpoint) and turns them into slice groups, one
// per port set and family, in a stable order.
func desiredGroups(ep *corev1.Endpoints, maxPerSubset int, p *Plan) []*group {
	groups := map[string]*group{}
	for _, sub := range repack(ep.Subsets) {
		ports := endpointPorts(sub.ports)
		added := 0
		for _, a := range sub.addrs {
			if added >= maxPerSubset {
				p.Skipped++
				continue
			}
			e, family, ok := toEndpoint(a.addr, a.ready)
			if !ok {
				p.Invalid++
				continue
			}
			added++
			k := sliceKey(family, ports)
			g := groups[k]
			if g == nil {
				g = &group{key: k, family: family, ports: ports}
				groups[k] = g
			}
			g.endpoints = append(g.endpoints, e)
		}
	}
	out := slices.Collect(maps.Values(groups))
	slices.SortFunc(out, func(a, b *group) int { return cmp.Compare(a.key, b.key) })
	return out
}

// sliceKey identifies a slice by address type and port set, in any order.
func sliceKey(family discovery.AddressType, ports []discovery.EndpointPort) string {
	return string(family) + "/" + string(esutil.NewPortMapKey(ports))
}

func endpointPorts(ports []corev1.EndpointPort) []discovery.EndpointPort {
	out := make([]discovery.EndpointPort, 0, len(ports))
	for _, p := range ports {
		out = append(out, discovery.EndpointPort{
			Name: new(p.Name), Port: new(p.Port), Protocol: new(p.Protocol), AppProtocol: p.AppProtocol,
		})
	}
	return out
}

// toEndpoint converts one address; it fails for an address that is not an
// IP. The address is written in canonical form.
func toEndpoint(a corev1.EndpointAddress, ready bool) (discovery.Endpoint, discovery.AddressType, bool) {
	ip, err := netip.ParseAddr(a.IP)
	if err != nil {
		ip, err = parseLeadingZeros(a.IP)
		if err != nil {
			return discovery.Endpoint{}, "", false
		}
	}
	family := discovery.AddressTypeIPv4
	if ip.Is6() && !ip.Is4In6() {
		family = discovery.AddressTypeIPv6
	}
	e := discovery.Endpoint{
		Addresses:  []string{ip.Unmap().String()},
		Conditions: discovery.EndpointConditions{Ready: new(ready)},
		TargetRef:  a.TargetRef,
		NodeName:   a.NodeName,
	}
	if a.Hostname != "" {
		e.Hostname = new(a.Hostname)
	}
	return e, family, true
}

// parseLeadingZeros accepts IPv4 with leading zeros ("010.0.0.1"), which
// the Kubernetes API tolerates in old objects, reading each part as decimal.
func parseLeadingZeros(s string) (netip.Addr, error) {
	parts := strings.Split(s, ".")
	if len(parts) != 4 {
		return netip.Addr{}, fmt.Errorf("not an IP: %q", s)
	}
	var b [4]byte
	for i, part := range parts {
		var n int
		if _, err := fmt.Sscanf(part, "%d", &n); err != nil || n < 0 || n > 255 || len(part) > 3 {
			return netip.Addr{}, fmt.Errorf("not an IP: %q", s)
		}
		b[i] = byte(n)
	}
	return netip.AddrFrom4(b), nil
}

// upToDate reports whether have already mirrors g and ep's metadata.
func upToDate(ep *corev1.Endpoints, have *discovery.EndpointSlice, g *group) bool {
	for _, o := range have.OwnerReferences {
		if o.Kind == "Endpoints" && o.Name == ep.Name && o.UID != ep.UID {
			return false // the Endpoints was recreated: rebuild the owner ref
		}
	}
	if !sameEndpoints(have.Endpoints, g.endpoints) {
		return false
	}
	gotLabels := without(have.Labels, discovery.LabelManagedBy, discovery.LabelServiceName)
	return apiequality.Semantic.DeepEqual(nilIfEmpty(gotLabels), nilIfEmpty(ep.Labels)) &&
		apiequality.Semantic.DeepEqual(nilIfEmpty(have.Annotations), nilIfEmpty(mirroredAnnotations(ep)))
}

func sameEndpoints(have, want []discovery.Endpoint) bool {
	if len(have) != len(want) {
		return false
	}
	set := esutil.EndpointSet{}
	for i := range want {
		set.Insert(&want[i])
	}
	for i := range have {
		w := set.Get(&have[i])
		if w == nil || !esutil.EndpointsEqualBeyondHash(w, &have[i]) {
			return false
		}
	}
	return true
}

func newSlice(ep *corev1.Endpoints, g *group) *discovery.EndpointSlice {
	labels := maps.Clone(ep.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[discovery.LabelServiceName] = ep.Name
	labels[discovery.LabelManagedBy] = ControllerName
	s := &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:       ep.Namespace,
			GenerateName:    slicePrefix(ep.Name),
			Labels:          labels,
			Annotations:     mirroredAnnotations(ep),
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(ep, corev1.SchemeGroupVersion.WithKind("Endpoints"))},
		},
		AddressType: g.family,
		Ports:       g.ports,
		Endpoints:   slices.Clone(g.endpoints),
	}
	if s.Endpoints == nil {
		s.Endpoints = []discovery.Endpoint{}
	}
	return s
}

// slicePrefix is "<name>-" unless that is not a valid object name prefix.
func slicePrefix(name string) string {
	if len(validation.IsDNS1123Subdomain(name+"-a")) == 0 {
		return name + "-"
	}
	return name
}

// mirroredAnnotations are the Endpoints' annotations minus the two that
// describe the Endpoints object itself.
func mirroredAnnotations(ep *corev1.Endpoints) map[string]string {
	a := without(ep.Annotations, corev1.EndpointsLastChangeTriggerTime, corev1.LastAppliedConfigAnnotation)
	if a == nil {
		a = map[string]string{}
	}
	return a
}

func without(m map[string]string, keys ...string) map[string]string {
	out := maps.Clone(m)
	for _, k := range keys {
		delete(out, k)
	}
	return out
}

func nilIfEmpty(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	return m
}

// recycle turns a create and a delete of the same address type into one
// update of the slice that would be deleted: one write instead of two.
func recycle(p *Plan) {
	for i := 0; i < len(p.Create); {
		j := slices.IndexFunc(p.Delete, func(d *discovery.EndpointSlice) bool {
			return d.AddressType == p.Create[i].AddressType
		})
		if j < 0 {
			i++
			continue
		}
		s := p.Create[i]
		s.Name, s.GenerateName = p.Delete[j].Name, ""
		p.Update = append(p.Update, s)
		p.Create = slices.Delete(p.Create, i, i+1)
		p.Delete = slices.Delete(p.Delete, j, j+1)
	}
}
