package dns

import (
	"slices"
	"strings"
	"testing"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// The fixture is the one CoreDNS's kubernetes plugin tests answer from
// (plugin/kubernetes/handler_test.go: svc1, svcempty, svc6, hdls1, external
// and the others in testns), written as API objects: selector-less Services
// with hand-made EndpointSlices, so hostnames and addresses are exact. The
// same objects serve the unit tables and the tests against a real API server.

func clusterIPService(ns, name string, ips []string, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: ips[0], ClusterIPs: ips, Ports: ports},
	}
}

func headlessService(ns, name string, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: corev1.ClusterIPNone, Ports: ports},
	}
}

func externalService(ns, name, target string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: target},
	}
}

func httpPort() corev1.ServicePort {
	return corev1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}
}

// ep is an endpoint: address, hostname ("" for none), ready.
type ep struct {
	addr  string
	host  string
	ready bool
}

func slice(ns, name, svc string, family discoveryv1.AddressType, ports []discoveryv1.EndpointPort, eps ...ep) *discoveryv1.EndpointSlice {
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{
			discoveryv1.LabelServiceName: svc,
			discoveryv1.LabelManagedBy:   "netplane-dns-test",
		}},
		AddressType: family,
		Ports:       ports,
	}
	for _, e := range eps {
		d := discoveryv1.Endpoint{Addresses: []string{e.addr}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(e.ready)}}
		if e.host != "" {
			d.Hostname = ptr.To(e.host)
		}
		sl.Endpoints = append(sl.Endpoints, d)
	}
	return sl
}

func httpSlicePorts() []discoveryv1.EndpointPort {
	return []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](80)}}
}

type fixtureObjects struct {
	services   []*corev1.Service
	slices     []*discoveryv1.EndpointSlice
	namespaces []string
	pods       []*corev1.Pod
}

// clientPodIP is the address of testns/client, the pod autopath and
// verified pod records know.
const clientPodIP = "10.244.1.7"

func fixture() fixtureObjects {
	v4, v6 := discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6
	return fixtureObjects{
		namespaces: []string{"testns", "kube-system", "other"},
		services: []*corev1.Service{
			clusterIPService("testns", "svc1", []string{"10.96.100.1"}, httpPort()),
			clusterIPService("testns", "svcempty", []string{"10.96.100.2"}, httpPort()),
			clusterIPService("testns", "svc6", []string{"fd00:10:96::1"}, httpPort()),
			clusterIPService("testns", "svc-dual-stack", []string{"10.96.100.3", "fd00:10:96::3"}, httpPort()),
			headlessService("testns", "hdls1", httpPort()),
			headlessService("testns", "hdlsprtls"),
			headlessService("testns", "svc-unready", httpPort()),
			headlessService("testns", "sub"),
			externalService("testns", "external", "example.net"),
			externalService("testns", "external-to-service", "svc1.testns.svc.cluster.local."),
			clusterIPService("kube-system", "kube-dns", []string{"10.96.0.10"},
				corev1.ServicePort{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53}),
			clusterIPService("other", "svc1", []string{"10.96.100.9"}, httpPort()),
		},
		slices: []*discoveryv1.EndpointSlice{
			slice("testns", "svc1-a", "svc1", v4, httpSlicePorts(), ep{"172.16.0.1", "ep1a", true}),
			slice("testns", "svcempty-a", "svcempty", v4, httpSlicePorts()),
			slice("testns", "hdls1-v4", "hdls1", v4, httpSlicePorts(),
				ep{"172.16.0.2", "", true}, ep{"172.16.0.3", "", true},
				ep{"172.16.0.4", "dup-name", true}, ep{"172.16.0.5", "dup-name", true},
				ep{"172.16.0.9", "", false}),
			slice("testns", "hdls1-v6", "hdls1", v6, httpSlicePorts(),
				ep{"5678:abcd::1", "", true}, ep{"5678:abcd::2", "", true}),
			// The same address from a second manager is one endpoint.
			slice("testns", "hdls1-mirror", "hdls1", v4, httpSlicePorts(), ep{"172.16.0.2", "", true}),
			slice("testns", "hdlsprtls-a", "hdlsprtls", v4, nil, ep{"172.16.0.20", "", true}),
			slice("testns", "svc-unready-a", "svc-unready", v4, httpSlicePorts(), ep{"172.16.0.30", "", false}),
			slice("testns", "sub-a", "sub", v4, nil, ep{"172.16.0.40", "web-0", true}),
			// 172.16.0.1 also backs a Service in another namespace.
			slice("other", "svc1-a", "svc1", v4, httpSlicePorts(), ep{"172.16.0.1", "", true}),
		},
		pods: []*corev1.Pod{{
			ObjectMeta: metav1.ObjectMeta{Namespace: "testns", Name: "client"},
			Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: clientPodIP}}},
		}},
	}
}

// buildIndex makes a synced index from objects, the way the watcher does.
func buildIndex(t testing.TB, o fixtureObjects) *Index {
	t.Helper()
	c := NewIndex().Edit()
	for _, ns := range o.namespaces {
		c.SetNamespace(ns, true)
	}
	for _, s := range o.services {
		var sls []*discoveryv1.EndpointSlice
		for _, sl := range o.slices {
			if sl.Namespace == s.Namespace && sl.Labels[discoveryv1.LabelServiceName] == s.Name {
				sls = append(sls, sl)
			}
		}
		c.SetService(svcKey{s.Namespace, s.Name}, buildService(s, sls))
	}
	for _, p := range o.pods {
		c.SetPod(p.Namespace, nil, podAddrs(p))
	}
	c.MarkSynced()
	return c.Done(1700000000)
}

func testZone(podRecords string) *Zone {
	return &Zone{Origin: "cluster.local.", TTL: 5, PodRecords: podRecords, DNSService: svcKey{"kube-system", "kube-dns"}}
}

// rrs parses records written in zone file syntax.
func rrs(t testing.TB, lines ...string) []dns.RR {
	t.Helper()
	var out []dns.RR
	for _, l := range lines {
		rr, err := dns.NewRR(l)
		if err != nil {
			t.Fatalf("bad test record %q: %v", l, err)
		}
		out = append(out, rr)
	}
	return out
}

// sectionText is a section as sorted lines, for comparison; SOA serials are
// blanked since they are times.
func sectionText(rs []dns.RR) []string {
	var out []string
	for _, r := range rs {
		if soa, ok := r.(*dns.SOA); ok {
			c := *soa
			c.Serial = 0
			r = &c
		}
		out = append(out, strings.ReplaceAll(r.String(), "\t", " "))
	}
	slices.Sort(out)
	return out
}

func checkSection(t testing.TB, what string, got, want []dns.RR) {
	t.Helper()
	g, w := sectionText(got), sectionText(want)
	if !slices.Equal(g, w) {
		t.Errorf("%s section:\n got: %s\nwant: %s", what, strings.Join(g, "\n      "), strings.Join(w, "\n      "))
	}
}
