package dns

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
)

// This file lets a reader outside the server (netplane explain) ask the
// answer logic about the few objects it fetched for one question.

// NewZone is the zone of a cluster domain ("cluster.local") with the
// server's rules for pod records (disabled, insecure, verified).
func NewZone(clusterDomain, podRecords, dnsService string) *Zone {
	ns, name, _ := strings.Cut(dnsService, "/")
	return &Zone{
		Origin:     strings.ToLower(strings.TrimSuffix(clusterDomain, ".")) + ".",
		TTL:        5,
		PodRecords: podRecords,
		DNSService: svcKey{ns, name},
	}
}

// IndexOf is a synced index of exactly these Services (their slices by
// Service) and namespaces: it answers about them as the server's index
// does, and says NXDOMAIN of everything else.
func IndexOf(svcs []*corev1.Service, slices map[types.NamespacedName][]*discoveryv1.EndpointSlice, namespaces []string) *Index {
	c := NewIndex().Edit()
	for _, ns := range namespaces {
		c.SetNamespace(ns, true)
	}
	for _, s := range svcs {
		c.SetNamespace(s.Namespace, true)
		key := types.NamespacedName{Namespace: s.Namespace, Name: s.Name}
		c.SetService(svcKey{s.Namespace, s.Name}, buildService(s, slices[key]))
	}
	c.MarkSynced()
	return c.Done(1)
}
