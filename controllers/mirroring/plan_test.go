package mirroring

//lint:file-ignore SA1019 mirroring reads the Endpoints API, deprecated since v1.33, by design: it exists for users who still write Endpoints.

import (
	"fmt"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func endpoints(subsets ...corev1.EndpointSubset) *corev1.Endpoints {
	return &corev1.Endpoints{
		ObjectMeta: metav1.ObjectMeta{Name: "ext", Namespace: "ns", UID: "ep-uid",
			Labels: map[string]string{"team": "x"},
			Annotations: map[string]string{"note": "kept", corev1.LastAppliedConfigAnnotation: "{}",
				corev1.EndpointsLastChangeTriggerTime: "2026-01-01T00:00:00Z"}},
		Subsets: subsets,
	}
}

func addrs(ips ...string) []corev1.EndpointAddress {
	var out []corev1.EndpointAddress
	for _, ip := range ips {
		out = append(out, corev1.EndpointAddress{IP: ip})
	}
	return out
}

func ports(nums ...int32) []corev1.EndpointPort {
	var out []corev1.EndpointPort
	for _, n := range nums {
		out = append(out, corev1.EndpointPort{Name: fmt.Sprintf("p%d", n), Port: n, Protocol: corev1.ProtocolTCP})
	}
	return out
}

// summary describes a slice as "family ports ready-addresses|not-ready".
func summary(s *discovery.EndpointSlice) string {
	var ps []int32
	for _, p := range s.Ports {
		ps = append(ps, *p.Port)
	}
	slices.Sort(ps)
	var ready, notReady []string
	for _, e := range s.Endpoints {
		if *e.Conditions.Ready {
			ready = append(ready, e.Addresses[0])
		} else {
			notReady = append(notReady, e.Addresses[0])
		}
	}
	return fmt.Sprintf("%s %v %v|%v", s.AddressType, ps, ready, notReady)
}

func summaries(ss []*discovery.EndpointSlice) []string {
	var out []string
	for _, s := range ss {
		out = append(out, summary(s))
	}
	slices.Sort(out)
	return out
}

func TestComputeFromNothing(t *testing.T) {
	cases := []struct {
		name    string
		ep      *corev1.Endpoints
		max     int
		want    []string
		skipped int
		invalid int
	}{
		{name: "one subset", ep: endpoints(corev1.EndpointSubset{Addresses: addrs("10.0.0.1", "10.0.0.2"), Ports: ports(80)}),
			want: []string{"IPv4 [80] [10.0.0.1 10.0.0.2]|[]"}},
		{name: "ready and not ready", ep: endpoints(corev1.EndpointSubset{Addresses: addrs("10.0.0.1"), NotReadyAddresses: addrs("10.0.0.2"), Ports: ports(80)}),
			want: []string{"IPv4 [80] [10.0.0.1]|[10.0.0.2]"}},
		{name: "one slice per family, canonical IPv6", ep: endpoints(corev1.EndpointSubset{Addresses: addrs("10.0.0.1", "fd00:0::1"), Ports: ports(80)}),
			want: []string{"IPv4 [80] [10.0.0.1]|[]", "IPv6 [80] [fd00::1]|[]"}},
		{name: "one slice per port set", ep: endpoints(
			corev1.EndpointSubset{Addresses: addrs("10.0.0.1"), Ports: ports(80)},
			corev1.EndpointSubset{Addresses: addrs("10.0.0.2"), Ports: ports(81, 82)}),
			want: []string{"IPv4 [80] [10.0.0.1]|[]", "IPv4 [81 82] [10.0.0.2]|[]"}},
		{name: "subsets with the same addresses merge their ports", ep: endpoints(
			corev1.EndpointSubset{Addresses: addrs("10.0.0.1"), Ports: ports(80)},
			corev1.EndpointSubset{Addresses: addrs("10.0.0.1"), Ports: ports(81)}),
			want: []string{"IPv4 [80 81] [10.0.0.1]|[]"}},
		{name: "not ready in one subset wins for that port", ep: endpoints(
			corev1.EndpointSubset{Addresses: addrs("10.0.0.1"), Ports: ports(80)},
			corev1.EndpointSubset{NotReadyAddresses: addrs("10.0.0.1"), Ports: ports(80)}),
			want: []string{"IPv4 [80] []|[10.0.0.1]"}},
		{name: "a subset without ports is kept", ep: endpoints(corev1.EndpointSubset{Addresses: addrs("10.0.0.1")}),
			want: []string{"IPv4 [] [10.0.0.1]|[]"}},
		{name: "addresses over the per-subset limit are skipped, ready first", max: 2,
			ep:   endpoints(corev1.EndpointSubset{Addresses: addrs("10.0.0.1", "10.0.0.2"), NotReadyAddresses: addrs("10.0.0.3"), Ports: ports(80)}),
			want: []string{"IPv4 [80] [10.0.0.1 10.0.0.2]|[]"}, skipped: 1},
		{name: "invalid IPs are skipped", ep: endpoints(corev1.EndpointSubset{Addresses: addrs("10.0.0.1", "not-an-ip"), Ports: ports(80)}),
			want: []string{"IPv4 [80] [10.0.0.1]|[]"}, invalid: 1},
		{name: "an Endpoints without subsets mirrors to nothing", ep: endpoints()},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			limit := tc.max
			if limit == 0 {
				limit = 1000
			}
			p := Compute(tc.ep, nil, limit)
			if len(p.Update)+len(p.Delete) != 0 {
				t.Errorf("from nothing: %d updates, %d deletes", len(p.Update), len(p.Delete))
			}
			if got := summaries(p.Create); !slices.Equal(got, tc.want) {
				t.Errorf("created %q, want %q", got, tc.want)
			}
			if p.Skipped != tc.skipped || p.Invalid != tc.invalid {
				t.Errorf("skipped %d invalid %d, want %d and %d", p.Skipped, p.Invalid, tc.skipped, tc.invalid)
			}
			for _, s := range p.Create {
				checkMeta(t, s)
			}
		})
	}
}

func checkMeta(t *testing.T, s *discovery.EndpointSlice) {
	t.Helper()
	if s.Labels[discovery.LabelManagedBy] != ControllerName || s.Labels[discovery.LabelServiceName] != "ext" || s.Labels["team"] != "x" {
		t.Errorf("labels %v", s.Labels)
	}
	if len(s.Annotations) != 1 || s.Annotations["note"] != "kept" {
		t.Errorf("annotations %v, want only note=kept", s.Annotations)
	}
	ref := s.OwnerReferences
	if len(ref) != 1 || ref[0].Kind != "Endpoints" || ref[0].UID != "ep-uid" {
		t.Errorf("owner refs %+v, want the Endpoints", ref)
	}
	if s.GenerateName != "ext-" && s.Name == "" {
		t.Errorf("generateName %q", s.GenerateName)
	}
}

// stored names created slices as the API server would.
func stored(p Plan) []*discovery.EndpointSlice {
	var out []*discovery.EndpointSlice
	for i, s := range p.Create {
		s = s.DeepCopy()
		s.Name, s.GenerateName = fmt.Sprintf("ext-%d", i), ""
		out = append(out, s)
	}
	return out
}

func TestComputeFollowsChanges(t *testing.T) {
	base := endpoints(corev1.EndpointSubset{Addresses: addrs("10.0.0.1", "fd00::1"), Ports: ports(80)})
	have := stored(Compute(base, nil, 1000))

	if p := Compute(base, have, 1000); p.Writes() != 0 {
		t.Errorf("unchanged: %d writes", p.Writes())
	}
	reordered := endpoints(corev1.EndpointSubset{Addresses: addrs("fd00::1", "10.0.0.1"), Ports: ports(80)})
	if p := Compute(reordered, have, 1000); p.Writes() != 0 {
		t.Errorf("reordered addresses: %d writes", p.Writes())
	}

	added := base.DeepCopy()
	added.Subsets[0].Addresses = append(added.Subsets[0].Addresses, corev1.EndpointAddress{IP: "10.0.0.2"})
	if p := Compute(added, have, 1000); len(p.Update) != 1 || p.Writes() != 1 || p.Update[0].Name == "" {
		t.Errorf("address added: %d creates %d updates %d deletes, want 1 update in place", len(p.Create), len(p.Update), len(p.Delete))
	}

	relabelled := base.DeepCopy()
	relabelled.Labels["team"] = "y"
	if p := Compute(relabelled, have, 1000); len(p.Update) != 2 || p.Writes() != 2 {
		t.Errorf("label changed: %d writes, want both slices updated", p.Writes())
	}

	newPort := base.DeepCopy()
	newPort.Subsets[0].Ports = ports(8080)
	if p := Compute(newPort, have, 1000); len(p.Update) != 2 || p.Writes() != 2 {
		t.Errorf("port changed: %d creates %d updates %d deletes, want 2 recycled updates", len(p.Create), len(p.Update), len(p.Delete))
	}

	v4only := endpoints(corev1.EndpointSubset{Addresses: addrs("10.0.0.1"), Ports: ports(80)})
	if p := Compute(v4only, have, 1000); len(p.Delete) != 1 || p.Writes() != 1 || p.Delete[0].AddressType != discovery.AddressTypeIPv6 {
		t.Errorf("IPv6 address gone: %d writes, want the IPv6 slice deleted", p.Writes())
	}

	recreated := base.DeepCopy()
	recreated.UID = "other"
	if p := Compute(recreated, have, 1000); len(p.Update) != 2 || p.Update[0].OwnerReferences[0].UID != "other" {
		t.Errorf("Endpoints recreated: %d updates, want both re-owned", len(p.Update))
	}

	if p := Compute(endpoints(), have, 1000); len(p.Delete) != 2 || p.Writes() != 2 {
		t.Errorf("all addresses gone: %d writes, want 2 deletes", p.Writes())
	}

	dup := append(have, have[0].DeepCopy())
	dup[2].Name = "ext-dup"
	if p := Compute(base, dup, 1000); len(p.Delete) != 1 || p.Writes() != 1 {
		t.Errorf("duplicate slice for one port set: %d writes, want it deleted", p.Writes())
	}
}
