// Package relay is the pod relay: one watch of every pod on the API
// server, served to many node roles as digests (the few fields a node's
// rules read). Every node role needs every pod for NetworkPolicy; at 5,000
// nodes that is 5,000 watches of every pod change on the API server. With
// relays, the API server has one watch per relay, and a node role
// receives nothing for the status updates that change no digest
// (docs/scale.md). Calico's Typha plays the same part for Felix.
//
// A relay speaks the API server's own protocol for pods (list with pages,
// watch from a resource version, bookmarks, "too old resource version"),
// so a node role reads it with client-go's reflector, and resumes on
// another relay, or lists again, as it would on the API server. Versions
// are the API server's, so they mean the same on every relay.
package relay

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/internal/informer"
	"github.com/netplane/netplane/internal/listen"
	"github.com/netplane/netplane/internal/memory"
	"github.com/netplane/netplane/internal/role"
)

// gcPercent is the relay's GOGC unless $GOGC is set, as the node role's:
// its store of every pod's digest is a large, long-lived heap, which Go's
// default would let double before each collection.
const gcPercent = 50

// Role is the relay role as the process builds it: its view of every pod,
// kept as digests in a store, and the server of that store.
func Role(d role.Deps) []role.Runnable {
	memory.DefaultGCPercent(gcPercent)
	store := NewStore()
	h := d.Factory.Register(informer.View{Kind: informer.Pods, Name: v1alpha1.RoleRelay, Sink: store,
		Record: func(o runtime.Object) any { return Digest(o.(*v1.Pod)) }})
	return []role.Runnable{{Role: v1alpha1.RoleRelay, Run: func(ctx context.Context) error {
		return run(ctx, d, store, h)
	}}}
}

func run(ctx context.Context, d role.Deps, store *Store, h *informer.Handle) error {
	cfg := d.Config.Relay
	// The certificate is read again when its files change (a renewed
	// Secret under the pod), without a restart; open watches keep theirs.
	certs, err := certwatcher.New(cfg.TLSCertFile, cfg.TLSKeyFile)
	if err != nil {
		return fmt.Errorf("the relay's serving certificate: %w", err)
	}
	go func() {
		if err := certs.Start(ctx); err != nil {
			d.Log.Error(err, "watching the serving certificate's files; serving the one read at start")
		}
	}()
	ln, err := listen.Shared("tcp", cfg.BindAddress)
	if err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	srv := &http.Server{
		Handler:           &Server{Store: store, Auth: &Reviews{Client: d.Client}, Metrics: NewMetrics(d.Metrics, store)},
		TLSConfig:         &tls.Config{GetCertificate: certs.GetCertificate, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second,
		// Watches end with ctx, so the stop does not wait for them.
		BaseContext: func(net.Listener) context.Context { return ctx },
	}
	served := make(chan error, 1)
	go func() { served <- srv.ServeTLS(ln, "", "") }()
	d.Log.Info("serving pods to node roles", "address", ln.Addr().String())
	d.Factory.Start(ctx)
	if role.WaitForSync(ctx, d, v1alpha1.RoleRelay, h.Synced()) {
		// The first list's garbage (every pod decoded whole, a page at a
		// time) back now rather than over the next minutes.
		memory.ReleaseStartup()
	}
	select {
	case <-ctx.Done():
	case err := <-served:
		return fmt.Errorf("relay: %w", err)
	}
	// Open watches ended with ctx: their node roles watch again, on
	// another relay.
	stop, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := srv.Shutdown(stop); err != nil {
		return errors.Join(err, srv.Close())
	}
	return nil
}
