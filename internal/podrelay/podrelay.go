// Package podrelay is a node role's client of the pod relays (the relay
// role): a clientset whose requests go to one of the relays behind a
// Service, found through the Service's EndpointSlices on the API server.
// Each node prefers its own relay of the ready ones (rendezvous hashing
// of its name), so nodes spread over the relays and keep to one while it
// stays; when a request to it fails, the next one is tried.
package podrelay

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// PortName is the name of the relays' port in their Service; a Service of
// one port may leave it unnamed.
const PortName = "relay"

// refreshEvery bounds how often the relays' endpoints are read again when
// none answers.
const refreshEvery = time.Second

// Client returns a clientset reading from the relays of service
// (namespace/name) as node, authenticated with the bearer token of
// restConfig (a service account's), checking the relays' certificates
// against caFile for the name name.namespace.svc. api reads the
// Service's EndpointSlices.
func Client(api kubernetes.Interface, restConfig *rest.Config, service, caFile, node string) (kubernetes.Interface, error) {
	ns, name, ok := strings.Cut(service, "/")
	if !ok {
		return nil, fmt.Errorf("pod relay %q: not namespace/name", service)
	}
	if restConfig.BearerToken == "" && restConfig.BearerTokenFile == "" {
		return nil, errors.New("reading pods from relays needs a bearer token (a service account's): the relays ask the API server who holds it")
	}
	cfg := &rest.Config{
		Host:            "https://" + name + "." + ns + ".svc",
		BearerToken:     restConfig.BearerToken,
		BearerTokenFile: restConfig.BearerTokenFile,
		TLSClientConfig: rest.TLSClientConfig{CAFile: caFile, ServerName: name + "." + ns + ".svc"},
		ContentConfig:   rest.ContentConfig{ContentType: "application/vnd.kubernetes.protobuf", AcceptContentTypes: "application/vnd.kubernetes.protobuf"},
		QPS:             restConfig.QPS,
		Burst:           restConfig.Burst,
		UserAgent:       restConfig.UserAgent,
		Dial:            restConfig.Dial,
	}
	p := &Picker{api: api, namespace: ns, service: name, node: node}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { p.next = rt; return p })
	return kubernetes.NewForConfig(cfg)
}

// Picker sends each request to the relay of the moment.
type Picker struct {
	api                      kubernetes.Interface
	namespace, service, node string
	next                     http.RoundTripper

	mu      sync.Mutex
	addrs   []string // host:port, in this node's order
	at      int      // the relay of the moment: addrs[at]
	fetched time.Time
}

// RoundTrip implements http.RoundTripper.
func (p *Picker) RoundTrip(req *http.Request) (*http.Response, error) {
	addr, err := p.relay(req.Context())
	if err != nil {
		return nil, err
	}
	r := req.Clone(req.Context())
	r.URL.Host, r.Host = addr, ""
	resp, err := p.next.RoundTrip(r)
	if err != nil || resp.StatusCode == http.StatusServiceUnavailable {
		p.failed(addr)
	}
	return resp, err
}

// relay is the address of the relay of the moment, reading the
// Service's endpoints when none is known.
func (p *Picker) relay(ctx context.Context) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.at < len(p.addrs) {
		return p.addrs[p.at], nil
	}
	if wait := refreshEvery - time.Since(p.fetched); wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return "", ctx.Err()
		}
	}
	p.fetched = time.Now()
	l, err := p.api.DiscoveryV1().EndpointSlices(p.namespace).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + p.service})
	if err != nil {
		return "", fmt.Errorf("the pod relays' endpoints: %w", err)
	}
	p.addrs, p.at = Order(Ready(l.Items), p.node), 0
	if len(p.addrs) == 0 {
		return "", fmt.Errorf("no ready pod relay behind Service %s/%s", p.namespace, p.service)
	}
	return p.addrs[0], nil
}

func (p *Picker) failed(addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.at < len(p.addrs) && p.addrs[p.at] == addr {
		p.at++
	}
}

// Ready are the ready relays' addresses (host:port) in slices.
func Ready(slices []discoveryv1.EndpointSlice) []string {
	var out []string
	for _, s := range slices {
		port := int32(0)
		for _, sp := range s.Ports {
			if sp.Port != nil && (sp.Name != nil && *sp.Name == PortName || len(s.Ports) == 1) {
				port = *sp.Port
			}
		}
		if port == 0 {
			continue
		}
		for _, e := range s.Endpoints {
			if e.Conditions.Ready != nil && !*e.Conditions.Ready || len(e.Addresses) == 0 {
				continue
			}
			out = append(out, net.JoinHostPort(e.Addresses[0], strconv.Itoa(int(port))))
		}
	}
	return out
}

// Order sorts addrs by their rendezvous weight for node: every node has
// its own order, the same wherever it is computed, and a relay that goes
// moves only its own nodes.
func Order(addrs []string, node string) []string {
	w := func(a string) uint64 {
		h := sha256.Sum256([]byte(node + "\x00" + a))
		return binary.BigEndian.Uint64(h[:8])
	}
	out := slices.Clone(addrs)
	slices.SortFunc(out, func(a, b string) int {
		wa, wb := w(a), w(b)
		switch {
		case wa > wb:
			return -1
		case wa < wb:
			return 1
		}
		return strings.Compare(a, b)
	})
	return slices.Compact(out)
}
