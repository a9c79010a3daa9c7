package charts

import (
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/netplane/netplane/config"
)

var relayValues = map[string]any{"relay": map[string]any{"enabled": true, "replicas": 2}}

func TestRelayValuesRenderTheRelaysAndPointTheAgentsAtThem(t *testing.T) {
	if objs := render(t, nil); findIn(objs, "Deployment", "netplane-relay") != nil {
		t.Fatal("the relays render by default; they are for large clusters and off unless asked for")
	}
	objs := render(t, relayValues)
	for _, want := range []struct{ kind, name string }{
		{"Deployment", "netplane-relay"}, {"Service", "netplane-relay"}, {"Secret", "netplane-relay-tls"},
		{"ConfigMap", "netplane-relay-ca"}, {"ConfigMap", "netplane-relay"}, {"ServiceAccount", "netplane-relay"}, {"ClusterRole", "netplane-relay"},
	} {
		find(t, objs, want.kind, want.name)
	}
	dep := find(t, objs, "Deployment", "netplane-relay")
	if st := fmt.Sprint(dep.Object["spec"].(map[string]any)["strategy"]); !strings.Contains(st, "maxSurge:0") || !strings.Contains(st, "maxUnavailable:1") {
		t.Errorf("relay strategy %s: with a host port a node, a surge pod finds no node where every node has a relay, and the rollout stops", st)
	}
	nodeConfig(t, objs, relayValues, []string{"  podRelay:", "    caFile: /etc/netplane-relay/ca.crt", "    service: kube-system/netplane-relay"})
	ds := find(t, objs, "DaemonSet", "netplane-node")
	cs, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
	if m := fmt.Sprint(cs[0].(map[string]any)["volumeMounts"]); !strings.Contains(m, "/etc/netplane-relay") {
		t.Errorf("the node agent does not mount the relays' authority: %v", m)
	}
	// The agent gets the authority, never the relay's key.
	vols, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "volumes")
	if v := fmt.Sprint(vols); !strings.Contains(v, "netplane-relay-ca") || strings.Contains(v, "netplane-relay-tls") {
		t.Errorf("the node agent's volumes: %v; want the relays' authority, not their key", v)
	}

	// The serving certificate is the Service's, signed by the authority the agents get.
	secret := find(t, objs, "Secret", "netplane-relay-tls")
	data, _, _ := unstructured.NestedStringMap(secret.Object, "data")
	crtPEM, _ := base64.StdEncoding.DecodeString(data["tls.crt"])
	caConf, _, _ := unstructured.NestedString(find(t, objs, "ConfigMap", "netplane-relay-ca").Object, "data", "ca.crt")
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM([]byte(caConf)) {
		t.Fatalf("the agents' ca.crt holds no certificate: %q", caConf)
	}
	block, _ := pem.Decode(crtPEM)
	if block == nil {
		t.Fatal("tls.crt holds no certificate")
	}
	crt, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := crt.Verify(x509.VerifyOptions{Roots: pool, DNSName: "netplane-relay.kube-system.svc", KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Errorf("the relay's certificate does not verify for its Service's name: %v", err)
	}

	// The relay's and the agent's files load and validate as netplane's own.
	for _, role := range []string{"relay", "node"} {
		conf, _, _ := unstructured.NestedString(find(t, objs, "ConfigMap", "netplane-"+role).Object, "data", "config.yaml")
		path := filepath.Join(t.TempDir(), "config.yaml")
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		fs := pflag.NewFlagSet(role, pflag.ContinueOnError)
		table := config.AddFlags(fs)
		args := []string{"--config=" + path}
		if role == "node" {
			args = append(args, "--node-name=n1")
		}
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		if _, err := config.Load(fs, table); err != nil {
			t.Errorf("the %s role's file does not load: %v\n%s", role, err, conf)
		}
	}
}
