package framework

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// APIServer is a running etcd + kube-apiserver pair.
type APIServer struct {
	URL        string // https://127.0.0.1:PORT
	Kubeconfig string // path of an admin kubeconfig
	Token      string // the admin bearer token
	Dir        string // working directory: data, certificates, logs
	RestConfig *rest.Config
	Client     kubernetes.Interface

	etcd, apiserver *Process
}

// Options change how the API server is started.
type Options struct {
	// ServiceCIDRs is --service-cluster-ip-range; default dual-stack
	// 10.96.0.0/16,fd00:10:96::/112.
	ServiceCIDRs string
	// Admission, when true, keeps the ServiceAccount admission plugin, which
	// needs kube-controller-manager to create each namespace's default
	// ServiceAccount before pods can be created.
	Admission bool
	// BindAddress is the address it serves on; default 127.0.0.1.
	BindAddress string
	// ExtraArgs are appended to kube-apiserver's arguments.
	ExtraArgs []string
}

// StartAPIServer starts etcd and kube-apiserver for the test and stops them
// (and removes their data) when it ends. It skips or fails, per Require,
// when the binaries are missing.
func StartAPIServer(t testing.TB, opts Options) *APIServer {
	t.Helper()
	etcd := RequireBinary(t, "etcd")
	kas := RequireBinary(t, "kube-apiserver")
	dir, err := os.MkdirTemp("", "netplane-apiserver-")
	if err != nil {
		t.Fatal(err)
	}
	s, err := startAPIServer(dir, etcd, kas, opts)
	t.Cleanup(func() {
		if s != nil {
			if t.Failed() {
				t.Logf("kube-apiserver log tail:\n%s", s.apiserver.Tail(30))
			}
			s.Stop()
		}
		os.RemoveAll(dir)
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// StartAPIServerMain is StartAPIServer for TestMain: the caller must Stop it.
func StartAPIServerMain(opts Options) (*APIServer, error) {
	etcd, kas := Binary("etcd"), Binary("kube-apiserver")
	if etcd == "" || kas == "" {
		return nil, fmt.Errorf("etcd or kube-apiserver not found (run `make tools`)")
	}
	dir, err := os.MkdirTemp("", "netplane-apiserver-")
	if err != nil {
		return nil, err
	}
	s, err := startAPIServer(dir, etcd, kas, opts)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

func startAPIServer(dir, etcdBin, kasBin string, opts Options) (s *APIServer, err error) {
	if opts.ServiceCIDRs == "" {
		opts.ServiceCIDRs = "10.96.0.0/16,fd00:10:96::/112"
	}
	if opts.BindAddress == "" {
		opts.BindAddress = "127.0.0.1"
	}
	s = &APIServer{Dir: dir}
	defer func() {
		if err != nil {
			s.Stop()
			s = nil
		}
	}()
	ports, err := FreePorts(3)
	if err != nil {
		return s, err
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	peerURL := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	s.etcd, err = StartProcess("etcd", exec.Command(etcdBin,
		"--name=netplane-test",
		"--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=netplane-test="+peerURL,
		"--log-level=error",
	), filepath.Join(dir, "etcd.log"))
	if err != nil {
		return s, err
	}
	if s.Token, err = randomHex(16); err != nil {
		return s, err
	}
	port := strconv.Itoa(ports[2])
	args, err := apiServerArgs(dir, etcdURL, port, s.Token, opts)
	if err != nil {
		return s, err
	}
	s.apiserver, err = StartProcess("kube-apiserver", exec.Command(kasBin, args...), filepath.Join(dir, "kube-apiserver.log"))
	if err != nil {
		return s, err
	}
	s.URL = "https://" + net.JoinHostPort(opts.BindAddress, port)
	if err := s.waitReady(60 * time.Second); err != nil {
		return s, fmt.Errorf("%w\nkube-apiserver log:\n%s\netcd log:\n%s", err, s.apiserver.Tail(20), s.etcd.Tail(10))
	}
	s.Kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := s.WriteKubeconfig(s.Kubeconfig, "", s.Token); err != nil {
		return s, err
	}
	s.RestConfig, err = clientcmd.BuildConfigFromFlags("", s.Kubeconfig)
	if err != nil {
		return s, err
	}
	s.RestConfig.QPS, s.RestConfig.Burst = 200, 400
	s.Client, err = kubernetes.NewForConfig(s.RestConfig)
	return s, err
}

// apiServerArgs writes the token file (token as system:masters) and the
// service-account key into dir and returns kube-apiserver's flags for them.
func apiServerArgs(dir, etcdURL, port, token string, opts Options) ([]string, error) {
	if err := os.WriteFile(filepath.Join(dir, "tokens.csv"), []byte(token+",admin,admin,system:masters\n"), 0o600); err != nil {
		return nil, err
	}
	saKey := filepath.Join(dir, "sa.key")
	if err := writeRSAKey(saKey); err != nil {
		return nil, err
	}
	host := opts.BindAddress
	args := []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=" + host, "--advertise-address=" + host, "--secure-port=" + port,
		"--cert-dir=" + filepath.Join(dir, "certs"),
		"--token-auth-file=" + filepath.Join(dir, "tokens.csv"),
		"--service-account-key-file=" + saKey,
		"--service-account-signing-key-file=" + saKey,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-cluster-ip-range=" + opts.ServiceCIDRs,
		"--authorization-mode=Node,RBAC",
		"--allow-privileged=true",
		"--enable-priority-and-fairness=true",
		"--v=1",
	}
	// kube-apiserver refuses to publish a loopback address as the kubernetes
	// Service's endpoint; on loopback it publishes none.
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		args = append(args, "--endpoint-reconciler-type=none")
	}
	if !opts.Admission {
		args = append(args, "--disable-admission-plugins=ServiceAccount")
	}
	return append(args, opts.ExtraArgs...), nil
}

// CAFile is the self-signed certificate kube-apiserver made; it verifies
// the server's certificate.
func (s *APIServer) CAFile() string { return filepath.Join(s.Dir, "certs", "apiserver.crt") }

// WriteKubeconfig writes a kubeconfig for the given bearer token, with server
// overriding the URL (for a forwarded address) when not empty.
func (s *APIServer) WriteKubeconfig(path, server, token string) error {
	if server == "" {
		server = s.URL
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["netplane"] = &clientcmdapi.Cluster{Server: server, CertificateAuthority: s.CAFile(), TLSServerName: "127.0.0.1"}
	cfg.AuthInfos["user"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["netplane"] = &clientcmdapi.Context{Cluster: "netplane", AuthInfo: "user"}
	cfg.CurrentContext = "netplane"
	return clientcmd.WriteToFile(*cfg, path)
}

func (s *APIServer) waitReady(timeout time.Duration) error {
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	var last string
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		if s.apiserver.Exited() {
			return false, fmt.Errorf("kube-apiserver exited")
		}
		if s.etcd.Exited() {
			return false, fmt.Errorf("etcd exited")
		}
		req, _ := http.NewRequestWithContext(ctx, "GET", s.URL+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+s.Token)
		resp, err := client.Do(req)
		if err != nil {
			last = err.Error()
			return false, nil
		}
		resp.Body.Close()
		last = resp.Status
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil && (s.apiserver.Exited() || s.etcd.Exited()) {
		return err
	}
	if err != nil {
		return fmt.Errorf("kube-apiserver not ready after %v: %s", timeout, last)
	}
	return nil
}

// KillAPIServer kills kube-apiserver (SIGKILL), leaving etcd running.
func (s *APIServer) KillAPIServer() { s.apiserver.Kill() }

// RestartAPIServer starts kube-apiserver again on the same port with the
// same etcd, and returns once its /readyz answers ok, with that moment.
func (s *APIServer) RestartAPIServer(timeout time.Duration) (time.Time, error) {
	return s.restart(&s.apiserver, timeout)
}

// KillEtcd kills etcd (SIGKILL), leaving kube-apiserver running.
func (s *APIServer) KillEtcd() { s.etcd.Kill() }

// RestartEtcd starts etcd again with its data and ports, and returns once
// kube-apiserver's /readyz answers ok again, with that moment.
func (s *APIServer) RestartEtcd(timeout time.Duration) (time.Time, error) {
	return s.restart(&s.etcd, timeout)
}

func (s *APIServer) restart(p **Process, timeout time.Duration) (time.Time, error) {
	again, err := (*p).Again()
	if err != nil {
		return time.Time{}, err
	}
	*p = again
	if err := s.waitReady(timeout); err != nil {
		return time.Time{}, fmt.Errorf("%w\nkube-apiserver log:\n%s", err, s.apiserver.Tail(20))
	}
	return time.Now(), nil
}

// Stop stops kube-apiserver, then etcd.
func (s *APIServer) Stop() {
	if s.apiserver != nil {
		s.apiserver.Stop(10 * time.Second)
	}
	if s.etcd != nil {
		s.etcd.Stop(5 * time.Second)
	}
}

// Close stops the servers and removes their directory (for StartAPIServerMain).
func (s *APIServer) Close() {
	s.Stop()
	os.RemoveAll(s.Dir)
}

// Ctx is a context for API calls in tests, bounded so a hung call fails.
func Ctx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// FreePorts asks the kernel for n free loopback TCP ports.
func FreePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func randomHex(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

func writeRSAKey(path string) error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600)
}
