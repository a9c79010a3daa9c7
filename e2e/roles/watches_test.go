package roles

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/netplane/netplane/e2e/framework"
)

// TestRolesInOneProcessListAndWatchEachResourceOnce runs the controller and
// dns roles in one process, which read Services, EndpointSlices and Pods
// both (the controller whole, dns slimmed, the pods through a field
// selector), and counts what reaches the API server: one list and one
// watch per resource, the kube-dns ConfigMap among them.
func TestRolesInOneProcessListAndWatchEachResourceOnce(t *testing.T) {
	bin := framework.NetplaneBinaries(t)
	dir := t.TempDir()
	counter := startCounter(t)
	kubeconfig := filepath.Join(dir, "kubeconfig")
	writePlainKubeconfig(t, kubeconfig, counter.url)
	cmd := exec.Command(filepath.Join(bin, "netplane"), append([]string{"--role=controller,dns", "--kubeconfig=" + kubeconfig}, roleArgs(dir)...)...)
	// The test API server's etcd cannot serve watch-lists (the API server
	// answers 200 and then an error event, and client-go lists instead), so
	// client-go's watch-list is turned off: each informer then lists once
	// and watches once, which is what is counted. With watch-lists, one
	// stream would be both.
	cmd.Env = append(os.Environ(), "KUBE_FEATURE_WatchListClient=false")
	p, err := framework.StartProcess("netplane", cmd, filepath.Join(dir, "netplane.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop(5 * time.Second)
	defer func() {
		if t.Failed() {
			t.Logf("netplane log tail:\n%s", p.Tail(30))
		}
	}()
	health, _ := framework.ServedAddresses(t, p, 30*time.Second)
	framework.Eventually(t, 60*time.Second, "/readyz is 200", func() error {
		code, body, err := framework.HTTPGet(http.DefaultClient, "http://"+health+"/readyz")
		if err != nil || code != http.StatusOK {
			return fmt.Errorf("%d %s %v", code, body, err)
		}
		return nil
	})
	// configmaps: the dns role's one ConfigMap, kube-dns's, by name.
	resources := []string{"configmaps", "endpoints", "endpointslices", "namespaces", "nodes", "pods", "services"}
	want := map[string]int{}
	for _, r := range resources {
		want["list "+r], want["watch "+r] = 1, 1
	}
	// /readyz is 200 once every informer has listed, and each opens its
	// watch right after its list: once every list has its watch, the counts
	// are final, and a second informer of a resource is a second list.
	framework.Eventually(t, 10*time.Second, "a watch after every list", func() error {
		got := counter.counts()
		for _, r := range resources {
			if got["list "+r] == 0 || got["watch "+r] < got["list "+r] {
				return fmt.Errorf("lists and watches so far: %s", sorted(got))
			}
		}
		return nil
	})
	if got := counter.counts(); !maps.Equal(got, want) {
		t.Errorf("lists and watches reaching the API server:\n got %v\nwant %v", sorted(got), sorted(want))
	}
}

func sorted(m map[string]int) string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, fmt.Sprintf("%s=%d", k, m[k]))
	}
	return strings.Join(out, " ")
}

// apiCounter is a plain-HTTP reverse proxy on loopback in front of the API
// server, authenticating as its admin, that counts the lists and watches
// passing through.
type apiCounter struct {
	url string

	mu    sync.Mutex
	calls map[string]int // "list services", "watch pods"
}

func startCounter(t *testing.T) *apiCounter {
	t.Helper()
	ca, err := os.ReadFile(api.CAFile())
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	target, err := url.Parse(api.URL)
	if err != nil {
		t.Fatal(err)
	}
	c := &apiCounter{calls: map[string]int{}}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}}
	rp.FlushInterval = -1 // watches stream
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// client-go sends no token over plain HTTP: the proxy adds it.
		r.Header.Set("Authorization", "Bearer "+api.Token)
		call := listOrWatch(r)
		if call == "" {
			rp.ServeHTTP(w, r)
			return
		}
		// Counted once answered 200: a request refused (as a watch-list is
		// where the API server has no watch progress requests) is retried
		// another way and read nothing.
		rp.ServeHTTP(&onStatus{ResponseWriter: w, ok: func() {
			c.mu.Lock()
			c.calls[call]++
			c.mu.Unlock()
		}}, r)
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	c.url = "http://" + l.Addr().String()
	return c
}

func (c *apiCounter) counts() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.calls)
}

// onStatus calls ok when the response's status is 200.
type onStatus struct {
	http.ResponseWriter
	ok func()
}

func (o *onStatus) WriteHeader(code int) {
	if code == http.StatusOK {
		o.ok()
	}
	o.ResponseWriter.WriteHeader(code)
}

// Unwrap lets the proxy flush a watch's events as they come.
func (o *onStatus) Unwrap() http.ResponseWriter { return o.ResponseWriter }

// listOrWatch names a request that starts a list ("list RESOURCE": its
// first page, or a watch that streams the list first) or a watch ("watch
// RESOURCE"), and is "" for any other.
func listOrWatch(r *http.Request) string {
	if r.Method != http.MethodGet {
		return ""
	}
	segs := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	switch {
	case len(segs) >= 2 && segs[0] == "api":
		segs = segs[2:]
	case len(segs) >= 3 && segs[0] == "apis":
		segs = segs[3:]
	default:
		return ""
	}
	if len(segs) > 2 && segs[0] == "namespaces" {
		segs = segs[2:]
	}
	if len(segs) != 1 {
		return "" // one object, or a subresource
	}
	q := r.URL.Query()
	watch := q.Get("watch") == "true" || q.Get("watch") == "1"
	switch {
	case watch && q.Get("sendInitialEvents") == "true":
		return "list " + segs[0]
	case watch:
		return "watch " + segs[0]
	case q.Get("continue") == "":
		return "list " + segs[0]
	}
	return ""
}

// writePlainKubeconfig writes a kubeconfig for server, a plain-HTTP URL.
func writePlainKubeconfig(t *testing.T, path, server string) {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["counter"] = &clientcmdapi.Cluster{Server: server}
	cfg.AuthInfos["none"] = &clientcmdapi.AuthInfo{}
	cfg.Contexts["counter"] = &clientcmdapi.Context{Cluster: "counter", AuthInfo: "none"}
	cfg.CurrentContext = "counter"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
}
