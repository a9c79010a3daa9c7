package lab

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
)

// controlPlane is the processes of the control-plane host, stopped in
// reverse order of start.
type controlPlane struct {
	procs []*framework.Process
}

func (c *controlPlane) stop() {
	for i := len(c.procs) - 1; i >= 0; i-- {
		c.procs[i].Stop(10 * time.Second)
	}
}

// identity is one user the lab gives a bearer token to.
type identity struct{ user, groups string }

// identities are the lab's users: its own processes get cluster-admin
// rights (system:masters); netplane's pods are the chart's ServiceAccounts
// with the chart's RBAC; each kubelet is its node, as the Node authorizer
// expects.
func (l *Lab) identities() []identity {
	ids := []identity{
		{"admin", "system:masters"},
		{"system:kube-controller-manager", "system:masters"}, // all controllers under one identity
		{"system:kube-scheduler", ""},
		{"system:kube-proxy", ""}, // the upstream stack's, bound to system:node-proxier by default
	}
	for _, n := range l.Nodes {
		ids = append(ids, identity{"system:node:" + n.Name, "system:nodes"})
	}
	return ids
}

// startControlPlane starts etcd, kube-apiserver (on its underlay address,
// so the kubernetes Service has a real endpoint), kube-controller-manager
// and kube-scheduler in the control-plane host,
// and the relay to the API server in the root namespace.
func (l *Lab) startControlPlane(ctx context.Context) error {
	l.cp = &controlPlane{}
	if err := os.MkdirAll(l.path("logs"), 0o755); err != nil {
		return err
	}
	tokens, err := l.writeTokens()
	if err != nil {
		return err
	}
	saKey := l.path("cp", "sa.key")
	if err := writeRSAKey(saKey); err != nil {
		return err
	}
	if l.pki, err = writePKI(l.path("cp", "pki")); err != nil {
		return err
	}
	if err := l.startEtcdAndAPIServer(saKey); err != nil {
		return err
	}
	if err := l.startRelay(); err != nil {
		return err
	}
	if err := l.waitAPIServer(ctx, 90*time.Second); err != nil {
		return err
	}
	for user, token := range tokens {
		if err := l.writeKubeconfig(l.kubeconfigFor(user), l.Config.APIServerURL(), token); err != nil {
			return err
		}
	}
	return l.startControllers(saKey)
}

func (l *Lab) kubeconfigFor(user string) string {
	return l.path("kubeconfigs", strings.ReplaceAll(user, ":", "-")+".kubeconfig")
}

func (l *Lab) writeTokens() (map[string]string, error) {
	tokens := map[string]string{}
	var csv strings.Builder
	for i, id := range l.identities() {
		b := make([]byte, 16)
		if _, err := rand.Read(b); err != nil {
			return nil, err
		}
		tokens[id.user] = hex.EncodeToString(b)
		fmt.Fprintf(&csv, "%s,%s,uid%d,\"%s\"\n", tokens[id.user], id.user, i, id.groups)
	}
	if err := os.MkdirAll(l.path("cp"), 0o700); err != nil {
		return nil, err
	}
	return tokens, os.WriteFile(l.path("cp", "tokens.csv"), []byte(csv.String()), 0o600)
}

func (l *Lab) startEtcdAndAPIServer(saKey string) error {
	etcd, err := l.start(l.ControlPlane, "etcd", framework.Binary("etcd"),
		"--name=lab", "--data-dir="+l.path("cp", "etcd"),
		"--listen-client-urls=http://127.0.0.1:2379", "--advertise-client-urls=http://127.0.0.1:2379",
		"--listen-peer-urls=http://127.0.0.1:2380", "--initial-advertise-peer-urls=http://127.0.0.1:2380",
		"--initial-cluster=lab=http://127.0.0.1:2380", "--log-level=error")
	if err != nil {
		return err
	}
	l.cp.procs = append(l.cp.procs, etcd)
	kas, err := l.start(l.ControlPlane, "kube-apiserver", framework.Binary("kube-apiserver"),
		"--etcd-servers=http://127.0.0.1:2379",
		"--bind-address="+l.apiBindAddress(), "--advertise-address="+l.Config.APIServerIP(), "--secure-port="+strconv.Itoa(APIPort),
		"--tls-cert-file="+l.pki.APIServerCert, "--tls-private-key-file="+l.pki.APIServerKey,
		"--kubelet-client-certificate="+l.pki.KubeletClientCert, "--kubelet-client-key="+l.pki.KubeletClientKey,
		"--kubelet-preferred-address-types=InternalIP,Hostname",
		"--token-auth-file="+l.path("cp", "tokens.csv"),
		"--service-account-key-file="+saKey, "--service-account-signing-key-file="+saKey,
		"--service-account-issuer=https://kubernetes.default.svc."+ClusterDomain,
		"--service-cluster-ip-range="+l.Config.ServiceCIDRs(),
		"--authorization-mode=Node,RBAC", "--allow-privileged=true", "--v=1")
	if err != nil {
		return err
	}
	l.cp.procs = append(l.cp.procs, kas)
	return nil
}

// startRelay listens on 127.0.0.1 in the root namespace and relays each
// connection to the API server by dialing from inside the control-plane
// host: the only way into the lab, and no route or interface is involved.
func (l *Lab) startRelay() error {
	ln, err := net.Listen("tcp", l.APIListen)
	if err != nil {
		return fmt.Errorf("relay listen %s: %w", l.APIListen, err)
	}
	target := net.JoinHostPort(ControlPlaneIP, strconv.Itoa(APIPort))
	l.stopRelay = netns.Relay(ln, func() (net.Conn, error) { return l.ControlPlane.Dial("tcp", target) })
	l.APIAddress = ln.Addr().String()
	return nil
}

// waitAPIServer waits for /readyz through the relay, then makes the admin
// kubeconfig and client.
func (l *Lab) waitAPIServer(ctx context.Context, timeout time.Duration) error {
	admin := map[string]string{}
	data, err := os.ReadFile(l.path("cp", "tokens.csv"))
	if err != nil {
		return err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Split(line, ","); len(f) > 2 {
			admin[f[1]] = f[0]
		}
	}
	l.Kubeconfig = l.path("kubeconfig")
	if err := l.writeKubeconfig(l.Kubeconfig, "https://"+l.APIAddress, admin["admin"]); err != nil {
		return err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", l.Kubeconfig)
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = 100, 200
	l.RestConfig = cfg
	if l.Client, err = kubernetes.NewForConfig(cfg); err != nil {
		return err
	}
	return l.waitFor(timeout, "kube-apiserver ready", func(ctx context.Context) error {
		body, err := l.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			return fmt.Errorf("%v %s", err, body)
		}
		return nil
	})
}

// writeKubeconfig writes a kubeconfig for a bearer token; the API server's
// certificate names every address of server, so any client verifies it.
func (l *Lab) writeKubeconfig(path, server, token string) error {
	if err := os.MkdirAll(l.path("kubeconfigs"), 0o700); err != nil {
		return err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["lab"] = &clientcmdapi.Cluster{Server: server, CertificateAuthority: l.pki.CA}
	cfg.AuthInfos["user"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["lab"] = &clientcmdapi.Context{Cluster: "lab", AuthInfo: "user"}
	cfg.CurrentContext = "lab"
	return clientcmd.WriteToFile(*cfg, path)
}

// startControllers starts kube-controller-manager (without its EndpointSlice
// controllers: netplane's controller owns EndpointSlices; with node IPAM)
// and kube-scheduler, then waits for what pods need: the default
// ServiceAccount and the root CA ConfigMap.
func (l *Lab) startControllers(saKey string) error {
	controllers := "*,-endpointslice,-endpointslicemirroring"
	if l.upstream() {
		controllers = "*"
	}
	// A mask flag of a family the cluster lacks is refused.
	masks := l.Config.pick("--node-cidr-mask-size-ipv4=24", "--node-cidr-mask-size-ipv6=64")
	kcm, err := l.start(l.ControlPlane, "kube-controller-manager", append([]string{framework.Binary("kube-controller-manager")}, append(masks,
		"--kubeconfig="+l.kubeconfigFor("system:kube-controller-manager"),
		"--controllers="+controllers,
		"--allocate-node-cidrs", "--cluster-cidr="+l.Config.ClusterCIDRs(),
		"--service-cluster-ip-range="+l.Config.ServiceCIDRs(),
		"--service-account-private-key-file="+saKey, "--root-ca-file="+l.pki.CA,
		"--use-service-account-credentials=false", "--leader-elect=false",
		"--secure-port=0", "--v=1")...)...)
	if err != nil {
		return err
	}
	l.cp.procs = append(l.cp.procs, kcm)
	sched, err := l.start(l.ControlPlane, "kube-scheduler", framework.Binary("kube-scheduler"),
		"--kubeconfig="+l.kubeconfigFor("system:kube-scheduler"), "--leader-elect=false",
		"--secure-port=0", "--v=1")
	if err != nil {
		return err
	}
	l.cp.procs = append(l.cp.procs, sched)
	return l.waitFor(60*time.Second, "the default ServiceAccount and kube-root-ca.crt", func(ctx context.Context) error {
		if _, err := l.Client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{}); err != nil {
			return err
		}
		_, err := l.Client.CoreV1().ConfigMaps("default").Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		return err
	})
}

// waitFor polls fn (each call bounded to 5 s) until it returns nil,
// failing after timeout with fn's last error; a control-plane process
// that exits fails it at once.
func (l *Lab) waitFor(timeout time.Duration, what string, fn func(context.Context) error) error {
	return framework.Poll(context.Background(), 100*time.Millisecond, timeout, what, func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		err := fn(ctx)
		if err != nil && l.cp != nil { // nil in a lab another process runs (Attach)
			for _, p := range l.cp.procs {
				if p.Exited() {
					return framework.Final(fmt.Errorf("%s exited:\n%s", p.Name, p.Tail(20)))
				}
			}
		}
		return err
	})
}

func writeRSAKey(path string) error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600)
}

// apiBindAddress is where the API server listens: its IPv4 address, which
// the relay and the lab's hosts reach, and with IPv6 in the cluster every
// address, so that the IPv6 address it advertises answers too.
func (l *Lab) apiBindAddress() string {
	if l.Config.Family == FamilyIPv4 {
		return ControlPlaneIP
	}
	return "::"
}
