package dns

import (
	"context"
	"maps"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"

	"github.com/fsnotify/fsnotify"
	"github.com/go-logr/logr"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/internal/role"
)

// reconfig holds the forwarding settings of the two places that change
// while the server runs, the configuration file and the kube-dns
// ConfigMap, and reroutes the forwarder whenever the merge of the two
// changes.
type reconfig struct {
	fwd     *Forwarder
	resolv  []string // resolv.conf's nameservers, used when neither names upstream servers
	log     logr.Logger
	mu      sync.Mutex
	file    forwarding
	cm      forwarding
	current forwarding
}

func (r *reconfig) setFile(fw forwarding) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.file = fw
	r.apply("file")
}

func (r *reconfig) setConfigMap(fw forwarding) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cm = fw
	r.apply("configmap")
}

func (r *reconfig) apply(source string) {
	next := merge(r.file, r.cm, r.resolv)
	if r.current.stubs != nil && sameForwarding(next, r.current) {
		return
	}
	r.current = next
	routes := r.fwd.Reroute(next)
	r.log.Info("forwarding", "changedBy", source, "routes", routes.String())
	if len(routes.upstream.addrs) == 0 {
		r.log.Info("WARNING: no upstream DNS servers; names outside the cluster zone and the stub domains are answered SERVFAIL")
	}
}

func sameForwarding(a, b forwarding) bool {
	return slices.Equal(a.upstreams, b.upstreams) && maps.EqualFunc(a.stubs, b.stubs, slices.Equal)
}

// forwardingOf is the forwarding settings of a configuration.
func forwardingOf(c v1alpha1.DNS) forwarding {
	return forwarding{stubs: c.StubDomains, upstreams: c.UpstreamServers}
}

// needRestart names the fields of the dns section, as the file spells
// them, that differ between running and loaded other than those applied
// while running.
func needRestart(running, loaded v1alpha1.DNS) []string {
	a, b := reflect.ValueOf(running), reflect.ValueOf(loaded)
	var out []string
	for i := range a.NumField() {
		name, _, _ := strings.Cut(a.Type().Field(i).Tag.Get("json"), ",")
		if name == "stubDomains" || name == "upstreamServers" {
			continue
		}
		if !reflect.DeepEqual(a.Field(i).Interface(), b.Field(i).Interface()) {
			out = append(out, "dns."+name)
		}
	}
	return out
}

// followFile applies the forwarding settings of the configuration file
// whenever it changes, as CoreDNS's reload does, until ctx ends; other
// changed fields are logged as needing a restart. A file that does not
// load is logged and counted, and the last good settings stay. A mounted
// ConfigMap changes by an atomic swap of its ..data symlink, never by a
// write to the file, so the file's folder is watched.
func followFile(ctx context.Context, src role.Source, running v1alpha1.DNS, r *reconfig, m *metrics, log logr.Logger) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	if err := w.Add(filepath.Dir(src.File)); err != nil {
		w.Close()
		return err
	}
	go func() {
		defer w.Close()
		var told []string
		for {
			select {
			case <-ctx.Done():
				return
			case err := <-w.Errors:
				log.Error(err, "watching the configuration file", "file", src.File)
			case ev := <-w.Events:
				// A swap is several events in the folder; its last puts
				// ..data in place. Any other file there is no concern.
				if base := filepath.Base(ev.Name); base != "..data" && base != filepath.Base(src.File) {
					continue
				}
				cfg, err := src.Load()
				if err != nil {
					log.Error(err, "the changed configuration file is invalid; the last valid forwarding stays in force", "file", src.File)
					m.rejectedConfig("file")
					continue
				}
				r.setFile(forwardingOf(cfg.DNS))
				if fields := needRestart(running, cfg.DNS); !slices.Equal(fields, told) {
					told = fields
					if len(fields) > 0 {
						log.Info("the configuration file changed fields that apply only after a restart", "fields", fields)
					}
				}
			}
		}
	}()
	return nil
}
