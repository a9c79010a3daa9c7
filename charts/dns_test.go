package charts

import (
	"fmt"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/netplane/netplane/e2e/framework"
)

func dnsChecksum(t *testing.T, objs []*unstructured.Unstructured) string {
	t.Helper()
	sum, _, _ := unstructured.NestedString(find(t, objs, "Deployment", "netplane-dns").Object, "spec", "template", "metadata", "annotations", "checksum/config")
	return sum
}

// The DNS server applies changed forwarding from its mounted file, so a
// change to it alone rolls no pod; any other DNS setting does.
func TestForwardingValuesReachTheFileWithoutRollingThePods(t *testing.T) {
	base := dnsChecksum(t, render(t, nil))
	forwarding := map[string]any{"dns": map[string]any{"config": map[string]any{
		"stubDomains":     map[string]any{"corp.example": []any{"10.0.0.53", "10.0.0.54:5353"}},
		"upstreamServers": []any{"192.0.2.53"},
		"serveStale":      "1h",
	}}}
	objs := render(t, forwarding)
	conf, _, _ := unstructured.NestedString(find(t, objs, "ConfigMap", "netplane-dns").Object, "data", "config.yaml")
	for _, want := range []string{"stubDomains:", "corp.example:", "- 10.0.0.54:5353", "upstreamServers:", "serveStale: 1h", "kubeDNSConfigMap: kube-system/kube-dns"} {
		if !strings.Contains(conf, want) {
			t.Errorf("the DNS configuration lacks %q:\n%s", want, conf)
		}
	}
	if got := dnsChecksum(t, objs); got == base {
		t.Error("serveStale changed and the pods do not roll")
	}
	delete(forwarding["dns"].(map[string]any)["config"].(map[string]any), "serveStale")
	if got := dnsChecksum(t, render(t, forwarding)); got != base {
		t.Error("a stub domain or upstream change rolls the DNS pods, which apply it from their file")
	}
	for _, v := range []string{"", "dns/custom"} {
		objs := render(t, map[string]any{"dns": map[string]any{"config": map[string]any{"kubeDNSConfigMap": v}}})
		role := findIn(objs, "Role", "netplane-dns-kube-dns-configmap")
		if (role != nil) != (v != "") {
			t.Errorf("kubeDNSConfigMap %q: Role rendered = %v", v, role != nil)
		}
		if role != nil && (role.GetNamespace() != "dns" || !strings.Contains(fmt.Sprint(role.Object["rules"]), "resourceNames:[custom]")) {
			t.Errorf("kubeDNSConfigMap %q: Role %s/%s with %v", v, role.GetNamespace(), role.GetName(), role.Object["rules"])
		}
	}
	if _, err := tryRender(map[string]any{"dns": map[string]any{"config": map[string]any{"kubeDNSConfigMap": "kube-dns"}}}); err == nil || !strings.Contains(err.Error(), "kubeDNSConfigMap") {
		t.Errorf("a ConfigMap name without namespace: %v, want the schema to refuse it", err)
	}
}

// The DNS role may watch the kube-dns ConfigMap by name, and read no other.
func TestDNSRoleReadsOnlyTheKubeDNSConfigMap(t *testing.T) {
	s := sharedAPIServer(t)
	apply(t, s, render(t, nil), false)
	ctx := framework.Ctx(t)
	cfg := rest.CopyConfig(s.RestConfig)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + namespace + ":netplane-dns",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"}}
	dns, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	byName := metav1.ListOptions{FieldSelector: "metadata.name=kube-dns"}
	if _, err := dns.CoreV1().ConfigMaps(namespace).List(ctx, byName); err != nil {
		t.Errorf("listing the kube-dns ConfigMap by name: %v", err)
	}
	w, err := dns.CoreV1().ConfigMaps(namespace).Watch(ctx, byName)
	if err != nil {
		t.Errorf("watching the kube-dns ConfigMap by name: %v", err)
	} else {
		w.Stop()
	}
	for what, err := range map[string]error{
		"list every ConfigMap of " + namespace: func() error {
			_, err := dns.CoreV1().ConfigMaps(namespace).List(ctx, metav1.ListOptions{})
			return err
		}(),
		"get another ConfigMap": func() error {
			_, err := dns.CoreV1().ConfigMaps(namespace).Get(ctx, "netplane-dns", metav1.GetOptions{})
			return err
		}(),
		"list kube-dns in another namespace": func() error {
			_, err := dns.CoreV1().ConfigMaps("default").List(ctx, byName)
			return err
		}(),
	} {
		if !apierrors.IsForbidden(err) {
			t.Errorf("the DNS role may %s: %v", what, err)
		}
	}
	if !allowed(t, s, "system:serviceaccount:"+namespace+":netplane-dns", access{"create", "", "events", namespace}) {
		t.Error("the DNS role may not report an invalid kube-dns ConfigMap in an event")
	}
}
