package charts

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
)

// Each role runs with the arguments, environment and configuration file the
// chart renders, authenticated as its own ServiceAccount, inside a network
// namespace standing in for its pod (or, for the node agent, its node). What
// differs from a real pod is only how files reach it: the config file path
// instead of the ConfigMap mount, a kubeconfig holding the ServiceAccount
// token instead of the projected token, and for the node agent temporary
// folders instead of the host paths.
func TestRolesRunWithTheChartsConfigurationAndServiceAccounts(t *testing.T) {
	s := sharedAPIServer(t)
	objs := render(t, nil)
	apply(t, s, objs, false)
	bin := framework.NetplaneBinaries(t)
	ctx := framework.Ctx(t)
	nodeName := "chart-node"
	if _, err := s.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}, Spec: corev1.NodeSpec{PodCIDRs: []string{"10.244.9.0/24"}, PodCIDR: "10.244.9.0/24"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	for _, role := range []struct{ name, kind string }{
		{"controller", "Deployment"}, {"dns", "Deployment"}, {"node", "DaemonSet"},
	} {
		t.Run(role.name, func(t *testing.T) {
			dir := t.TempDir()
			workload := find(t, objs, role.kind, "netplane-"+role.name)
			cm := find(t, objs, "ConfigMap", "netplane-"+role.name)
			configYAML, _, _ := unstructured.NestedString(cm.Object, "data", "config.yaml")
			cfgPath := filepath.Join(dir, "config.yaml")
			if err := os.WriteFile(cfgPath, []byte(configYAML), 0o600); err != nil {
				t.Fatal(err)
			}
			args := containerField(t, workload, "args")
			for i, a := range args {
				if a == "--config=/etc/netplane/config.yaml" {
					args[i] = "--config=" + cfgPath
				}
			}
			kubeconfig := filepath.Join(dir, "kubeconfig")
			ns := netns.New(t, role.name)
			fwd := ns.Forward(t, "127.0.0.1:0", strings.TrimPrefix(s.URL, "https://"))
			if err := s.WriteKubeconfig(kubeconfig, "https://"+fwd, serviceAccountToken(t, s, "netplane-"+role.name)); err != nil {
				t.Fatal(err)
			}
			args = append(args, "--kubeconfig="+kubeconfig)
			if role.name == "node" {
				args = append(args, "--cni-bin-dir="+filepath.Join(dir, "cni-bin"), "--cni-conf-dir="+filepath.Join(dir, "net.d"),
					"--ipam-state-dir="+filepath.Join(dir, "ipam"), "--cni-plugin-path="+filepath.Join(bin, "netplane-cni"),
					"--proc-sys-dir=/proc/sys") // stands in for the /host/proc/sys/net mount; inside the test namespace

			}
			cmd := ns.Command(filepath.Join(bin, "netplane"), args...)
			cmd.Env = append(os.Environ(), "NETPLANE_NODE_NAME="+nodeName) // the DaemonSet's downward API value
			p, err := ns.StartCmd(cmd, filepath.Join(dir, "netplane.log"))
			if err != nil {
				t.Fatal(err)
			}
			defer p.Stop(5 * time.Second)
			client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
				DialContext: func(_ context.Context, network, addr string) (net.Conn, error) { return ns.Dial(network, addr) },
			}}
			framework.Eventually(t, 60*time.Second, role.name+" /readyz with the chart's configuration", func() string {
				code, body, err := framework.HTTPGet(client, "http://127.0.0.1:10290/readyz")
				if err != nil || code != http.StatusOK {
					return fmt.Sprintf("%d %s %v\n%s", code, body, err, p.Tail(5))
				}
				return ""
			})
			roleWorks[role.name](t, s, ns)
			if log := p.Tail(400); strings.Contains(log, "forbidden") {
				t.Errorf("%s was refused something by RBAC:\n%s", role.name, grepLines(log, "forbidden"))
			}
		})
	}
}

// roleWorks checks that each role does its job with the chart's RBAC: a
// read-only check would miss a missing write permission.
var roleWorks = map[string]func(t *testing.T, s *framework.APIServer, ns *netns.NS){
	"controller": func(t *testing.T, s *framework.APIServer, _ *netns.NS) {
		ctx := framework.Ctx(t)
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "chart-web", Namespace: "default"},
			Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "chart-web"}, Ports: []corev1.ServicePort{{Port: 80}}}}
		if _, err := s.Client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// No kube-controller-manager runs here to make the namespace's default ServiceAccount.
		s.Client.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "chart-web-1", Namespace: "default", Labels: map[string]string{"app": "chart-web"}},
			Spec: corev1.PodSpec{NodeName: "chart-node", Containers: []corev1.Container{{Name: "c", Image: "x"}}}}
		created, err := s.Client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		created.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.244.9.5", PodIPs: []corev1.PodIP{{IP: "10.244.9.5"}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
		if _, err := s.Client.CoreV1().Pods("default").UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		framework.Eventually(t, 60*time.Second, "the controller publishes the pod in an EndpointSlice", func() string {
			list, err := s.Client.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=chart-web"})
			if err != nil {
				return err.Error()
			}
			for _, sl := range list.Items {
				for _, ep := range sl.Endpoints {
					if len(ep.Addresses) > 0 && ep.Addresses[0] == "10.244.9.5" {
						return ""
					}
				}
			}
			return fmt.Sprintf("%d slices, none with 10.244.9.5", len(list.Items))
		})
	},
	"dns": func(t *testing.T, _ *framework.APIServer, ns *netns.NS) {
		framework.Eventually(t, 30*time.Second, "the DNS server answers for the kube-dns Service", func() string {
			out, err := ns.Exec("dig", "+short", "+time=1", "+tries=1", "@127.0.0.1", "kube-dns.kube-system.svc.cluster.local", "A")
			if err != nil || strings.TrimSpace(out) != "10.96.0.10" {
				return fmt.Sprintf("dig: %q %v", out, err)
			}
			return ""
		})
	},
	"node": func(t *testing.T, _ *framework.APIServer, ns *netns.NS) {
		framework.Eventually(t, 30*time.Second, "the node agent programs the kube-dns ClusterIP", func() string {
			out, err := ns.Exec("nft", "list", "table", "ip", "netplane")
			if err != nil || !strings.Contains(out, "10.96.0.10") {
				return fmt.Sprintf("nft: %v %.300s", err, out)
			}
			return ""
		})
	},
}

// serviceAccountToken asks the TokenRequest API for a token of the
// ServiceAccount, as the kubelet does for a pod's projected token.
func serviceAccountToken(t *testing.T, s *framework.APIServer, name string) string {
	t.Helper()
	tr, err := s.Client.CoreV1().ServiceAccounts(namespace).CreateToken(framework.Ctx(t), name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr(int64(3600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

func grepLines(text, word string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, word) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
