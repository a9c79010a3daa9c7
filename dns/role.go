// Package dns is netplane's cluster DNS server, a drop-in for CoreDNS in a
// Kubernetes cluster: authoritative for the cluster domain per the
// Kubernetes DNS specification (schema 1.1.0), with CoreDNS's behaviour
// where the specification is silent, and a caching forwarder for every
// other name.
//
// The answers are a pure function of an immutable Index (answer.go) built
// from slim copies of Services, EndpointSlices, Namespaces and Pods
// (objects.go, records.go) and swapped atomically as the informers report
// changes (index.go, watch.go). Around that sit the sockets (server.go),
// the query path with autopath (handler.go) and the forwarder with its
// cache (forward.go, cache.go).
package dns

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/internal/informer"
	"github.com/netplane/netplane/internal/memory"
	"github.com/netplane/netplane/internal/role"
)

// gcPercent is the dns role's GOGC unless the environment sets one. The
// index is long-lived and queries make little garbage (the packed
// replies make none), so Go's default (the heap may grow to twice what is
// live) would spend half the server's memory on garbage and raise the
// soft memory limit that bounds a relist with it. At 25 the search-path
// mix at full speed costs 14% more CPU a query than at 100, Service names
// nothing; the heap under that load is 6.9 MB smaller of 28.1, and a
// relist of 15,000 pods peaked 1.7 MB lower than at 50 (dns/README.md).
const gcPercent = 25

// Role is the dns role as the process builds it: the server and its views
// of the process's informers are made at once, and one part serves until
// ctx ends. The sockets open when it runs; until the views have synced, the
// cluster zone is answered SERVFAIL and other names are forwarded. An
// unreachable API server keeps it in that state, it never stops the
// process.
func Role(d role.Deps) []role.Runnable {
	// Beside the controller or the node role, which watch every pod (for
	// EndpointSlices, for NetworkPolicy), the pods are read from that one
	// watch rather than a second of the DNS's own.
	wire := !slices.Contains(d.Config.Roles, v1alpha1.RoleController) && !slices.Contains(d.Config.Roles, v1alpha1.RoleNode)
	s, err := newServer(d.Factory, d.Client, d.Config.DNS, d.Metrics, d.Log, wire)
	if err == nil && d.Source.File != "" && d.Source.Load != nil {
		s.source = d.Source
	}
	return []role.Runnable{{Role: v1alpha1.RoleDNS, Run: func(ctx context.Context) error {
		if err != nil {
			return err
		}
		return s.run(ctx, d)
	}}}
}

// closeBudget is the time left, of the process's shutdown timeout, for
// closing the sockets after the lame duck.
const closeBudget = 2 * time.Second

func (s *Server) run(ctx context.Context, d role.Deps) error {
	var serving, stopping atomic.Bool
	d.Checks.AddReady("dns", func() error {
		if stopping.Load() {
			return errors.New("stopping: answering for --lameduck before the sockets close")
		}
		if !serving.Load() {
			return errors.New("the DNS server has not started")
		}
		return s.Ready()
	})
	memory.DefaultGCPercent(gcPercent)
	// The executable's pages come back one by one, not 64 kB around each
	// read: internal/memory registers them as the process starts
	// (dns/README.md, "Memory"); say so when this kernel cannot.
	if err := memory.PagesOneByOne(); err != nil {
		d.Log.V(1).Info("the executable's pages come back 64 kB at a time", "reason", err)
	}
	l, err := Listen(d.Config.DNS.BindAddress, runtime.GOMAXPROCS(0))
	if err != nil {
		return err
	}
	s.Serve(ctx, l)
	serving.Store(true)
	<-ctx.Done()
	// Queries keep arriving until every node has dropped this server from
	// the Service's endpoints; closing at once would time them out.
	stopping.Store(true)
	if lame := d.Config.DNS.Lameduck.Duration; lame > 0 {
		d.Log.Info("lame duck: still answering before closing the sockets", "for", lame)
		lameDuck{min: lame, max: max(lame, d.Config.ShutdownTimeout.Duration-closeBudget), settle: time.Second,
			service: parseService(d.Config.DNS.DNSService), own: ownAddrs(), index: s.Handler.Index, poll: 50 * time.Millisecond}.wait(d.Log)
	}
	shutdown, cancel := context.WithTimeout(context.Background(), closeBudget)
	defer cancel()
	l.Shutdown(shutdown)
	return nil
}

// Server is a DNS server.
type Server struct {
	Handler *Handler
	// Listeners are the sockets, once it serves (Serve).
	Listeners *Listeners
	watch     *watcher
	config    v1alpha1.DNS
	client    kubernetes.Interface
	reconfig  *reconfig
	kubeDNS   *configMapWatch // nil when no kube-dns ConfigMap is read
	source    role.Source     // File "" when the file is not followed
	metrics   *metrics
	log       logr.Logger
}

// Ready reports whether the cluster zone is being answered and the
// forwarding is the configured one.
func (s *Server) Ready() error {
	if !s.Handler.Index().synced {
		return errors.New("the Service, EndpointSlice, Namespace and Pod caches have not synced yet: the cluster zone is answered SERVFAIL")
	}
	return s.kubeDNS.ready()
}

// Start opens the sockets on c.BindAddress and serves; see StartOn.
func Start(ctx context.Context, c v1alpha1.DNS, client kubernetes.Interface, reg prometheus.Registerer, log logr.Logger) (*Server, error) {
	l, err := Listen(c.BindAddress, runtime.GOMAXPROCS(0))
	if err != nil {
		return nil, err
	}
	s, err := StartOn(ctx, l, c, client, reg, log)
	if err != nil {
		l.Close()
	}
	return s, err
}

// StartOn serves on sockets already open (a test opens them inside a
// network namespace) and starts watching the API server through informers
// of its own.
func StartOn(ctx context.Context, l *Listeners, c v1alpha1.DNS, client kubernetes.Interface, reg prometheus.Registerer, log logr.Logger) (*Server, error) {
	s, err := New(informer.New(client), client, c, reg, log)
	if err != nil {
		return nil, err
	}
	s.Serve(ctx, l)
	return s, nil
}

// New builds a server of c whose index follows the views it registers on
// f, and whose forwarding follows the kube-dns ConfigMap through client;
// it serves once Serve is called.
func New(f *informer.Factory, client kubernetes.Interface, c v1alpha1.DNS, reg prometheus.Registerer, log logr.Logger) (*Server, error) {
	return newServer(f, client, c, reg, log, true)
}

// newServer is New; wire: the pods are read off the wire on a watch of
// their own (podwire.go), else as Pods from the factory's shared watch.
func newServer(f *informer.Factory, client kubernetes.Interface, c v1alpha1.DNS, reg prometheus.Registerer, log logr.Logger, wire bool) (*Server, error) {
	ns, name, _ := strings.Cut(c.DNSService, "/")
	z := &Zone{
		Origin:     strings.ToLower(strings.TrimSuffix(c.ClusterDomain, ".")) + ".",
		TTL:        uint32(c.TTL),
		PodRecords: c.PodRecords,
		DNSService: svcKey{ns, name},
	}
	resolvServers, search, rerr := ResolvConf(c.ResolvConf)
	if len(c.UpstreamServers) == 0 && rerr != nil {
		log.Info("WARNING: cannot read the upstream servers of --resolv-conf", "resolvConf", c.ResolvConf, "error", rerr)
	}
	m, err := newMetrics(reg, "dns://"+c.BindAddress, z.Origin)
	if err != nil {
		return nil, err
	}
	fwd := NewForwarder(nil, c.UpstreamTimeout.Duration, NewCache(int(c.CacheSize), c.CacheMaxTTL.Duration, c.ServeStale.Duration), m)
	s := &Server{config: c, client: client, metrics: m, log: log,
		reconfig: &reconfig{fwd: fwd, resolv: resolvServers, log: log}}
	s.reconfig.setFile(forwardingOf(c))
	s.Handler = NewHandler(z, fwd, m, c.Autopath, search)
	log.Info("DNS server", "zone", z.Origin, "autopath", c.Autopath, "podRecords", c.PodRecords, "serveStale", c.ServeStale.Duration, "kubeDNSConfigMap", c.KubeDNSConfigMap)
	// The pods are read through the factory's client, whose requests pass
	// the process's outage gate as its informers' do.
	var pc *podClient
	if wire {
		if pc, err = newPodClient(f.Client()); err != nil {
			return nil, err
		}
	}
	s.watch = newWatcher(f, s.Handler, m, log, c.Autopath || c.PodRecords == podsVerified, pc)
	if cmNS, cmName, ok := strings.Cut(c.KubeDNSConfigMap, "/"); ok {
		s.kubeDNS = &configMapWatch{ns: cmNS, name: cmName, metrics: m, log: log.WithName("kube-dns-configmap"),
			apply: func(data map[string]string) error {
				fw, err := parseKubeDNS(data, c.ClusterDomain)
				if err == nil {
					s.reconfig.setConfigMap(fw)
				}
				return err
			}}
	}
	return s, nil
}

// Serve answers on l and follows the API server (starting the informer
// factory), the kube-dns ConfigMap and the configuration file until ctx
// ends.
func (s *Server) Serve(ctx context.Context, l *Listeners) {
	l.Serve(s.Handler)
	s.Listeners = l
	s.log.Info("serving DNS", "address", l.Addr)
	go func() {
		if err := s.watch.run(ctx); err != nil {
			s.log.Error(err, "following the API server")
		}
	}()
	if s.kubeDNS != nil {
		followKubeDNS(ctx, s.watch.factory, s.client, s.kubeDNS)
	}
	if s.source.File != "" {
		if err := followFile(ctx, s.source, s.config, s.reconfig, s.metrics, s.log.WithName("config-file")); err != nil {
			s.log.Error(err, "cannot follow the configuration file: changes to it apply after a restart", "file", s.source.File)
		}
	}
}
