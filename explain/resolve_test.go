package explain

import (
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/netplane/netplane/dns"
)

func TestResolve(t *testing.T) {
	zone := dns.NewZone("cluster.local", "disabled", "kube-system/kube-dns")
	web := service("shop", "web", "10.96.0.20", svcPort("http", 80, 8080))
	headless := service("shop", "db", "None", svcPort("", 5432, 5432))
	dbSlice := slice(headless, "", 5432, ready(pod("shop", "db-0", "n1", "10.244.1.9", nil)))
	ix := dns.IndexOf([]*v1.Service{web, headless}, map[types.NamespacedName][]*discoveryv1.EndpointSlice{{Namespace: "shop", Name: "db"}: {dbSlice}}, []string{"shop", "x"})
	client := pod("x", "a", "n1", "10.244.1.10", nil)
	withDots := client.DeepCopy()
	withDots.Spec.DNSConfig = &v1.PodDNSConfig{Options: []v1.PodDNSConfigOption{{Name: "ndots", Value: ptr.To("1")}}, Searches: []string{"corp.example"}}
	cases := []struct {
		name    string
		client  *v1.Pod
		query   string
		address string
		tried   []string // rcodes in order
	}{
		{"search path finds the Service", client, "web.shop", "10.96.0.20", []string{"NXDOMAIN", "NOERROR"}},
		{"fully qualified", client, "web.shop.svc.cluster.local.", "10.96.0.20", []string{"NOERROR"}},
		{"headless: the pod's address", client, "db.shop.svc.cluster.local", "10.244.1.9", []string{"NXDOMAIN", "NXDOMAIN", "NXDOMAIN", "NOERROR"}},
		{"ndots 1: as is first, then upstream", withDots, "web.shop", "", []string{"upstream", "NXDOMAIN", "NOERROR"}},
		{"unknown name", client, "nope", "", []string{"NXDOMAIN", "NXDOMAIN", "NXDOMAIN", "upstream"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			search, ndots, ok := SearchPath(c.client, "cluster.local")
			if !ok {
				t.Fatal("the pod uses no cluster DNS")
			}
			r := Resolve(zone, ix, c.query, Candidates(c.query, search, ndots), search, ndots, false)
			var rcodes []string
			for _, q := range r.Tried {
				rcodes = append(rcodes, q.Rcode)
			}
			if c.address != "" && r.Address != c.address {
				t.Errorf("address %q, want %q (%+v)", r.Address, c.address, r.Tried)
			}
			if c.address == "" && c.name == "unknown name" && r.Address != "" {
				t.Errorf("address %q for an unknown name", r.Address)
			}
			if !slices.Equal(rcodes, c.tried) {
				t.Errorf("tried %v, want %v: %+v", rcodes, c.tried, r.Tried)
			}
		})
	}
	if got := ServicesNamed(Candidates("web.shop", []string{"x.svc.cluster.local"}, 5), zone); len(got) != 1 || got[0].Name != "shop" && got[0].Name != "web" {
		t.Errorf("ServicesNamed: %v", got)
	}
}

func TestText(t *testing.T) {
	in := world(podA, podB, 8080, netpol("x", "deny-all", nil, ingressOnly, nil, nil))
	x, err := Explain(in)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := WriteText(&b, x); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"From: pod x/a (10.244.1.10 on node n1)", "To:   x/b TCP/8080", "1. Backend x/b 10.244.2.10:8080 on node n2",
		"ingress to x/b: denied: isolated by x/deny-all", "path: VXLAN to node n2", "\nVerdict: Denied from x/a to x/b TCP/8080"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the text lacks %q:\n%s", want, b.String())
		}
	}
}
