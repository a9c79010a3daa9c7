package explain

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/netplane/netplane/dns"
	"github.com/netplane/netplane/nodeview"
)

// Question is what the command was asked.
type Question struct {
	From, To      string
	Namespace     string // for a bare POD in From or To
	Port          PortQuery
	ClusterDomain string            // cluster.local
	Settings      nodeview.Settings // the node role's
}

// reader reads the objects one question needs: targeted Gets and
// label- or field-selected Lists, never the cluster.
type reader struct {
	c   kubernetes.Interface
	ctx context.Context
	in  *Input
	q   Question
	ns  map[string]*v1.Namespace
	pod map[types.NamespacedName]*v1.Pod
}

// Read gathers the Input of q from the API server. An *Error names what
// q names that is not there.
func Read(ctx context.Context, c kubernetes.Interface, q Question) (*Input, error) {
	r := &reader{c: c, ctx: ctx, q: q, ns: map[string]*v1.Namespace{}, pod: map[types.NamespacedName]*v1.Pod{},
		in: &Input{To: q.To, Port: q.Port, Overlay: Overlay{Settings: q.Settings}}}
	nodes, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{ResourceVersion: "0"})
	if err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	for i := range nodes.Items {
		r.in.Nodes = append(r.in.Nodes, &nodes.Items[i])
	}
	if err := r.source(); err != nil {
		return nil, err
	}
	if err := r.destination(); err != nil {
		return nil, err
	}
	if err := r.policies(); err != nil {
		return nil, err
	}
	if err := r.clusterPolicies(); err != nil {
		return nil, err
	}
	return r.in, nil
}

// nodeOf is the node with address a.
func (r *reader) nodeOf(a netip.Addr) string {
	for _, n := range r.in.Nodes {
		for _, na := range n.Status.Addresses {
			if b, err := netip.ParseAddr(na.Address); err == nil && b.Unmap() == a {
				return n.Name
			}
		}
	}
	return ""
}

func (r *reader) source() error {
	if a, err := netip.ParseAddr(r.q.From); err == nil {
		a = a.Unmap()
		r.in.FromIP = a
		if r.in.FromNode = r.nodeOf(a); r.in.FromNode != "" {
			return nil
		}
		p, err := r.podByIP(a)
		if err != nil {
			return err
		}
		if p != nil {
			r.in.FromPod = p
			r.keepPod(p)
		}
		return nil
	}
	ns, name := r.split(r.q.From)
	if ns == "" || name == "" || strings.Count(r.q.From, "/") > 1 {
		return errorf("--from=%s: give NAMESPACE/POD, POD with --namespace, or an address", r.q.From)
	}
	p, err := r.getPod(ns, name)
	if err != nil {
		return err
	}
	r.in.FromPod = p
	return nil
}

// split reads NAMESPACE/NAME, or NAME in --namespace.
func (r *reader) split(s string) (string, string) {
	if ns, name, ok := strings.Cut(s, "/"); ok {
		return ns, name
	}
	return r.q.Namespace, s
}

func (r *reader) getPod(ns, name string) (*v1.Pod, error) {
	if p := r.pod[types.NamespacedName{Namespace: ns, Name: name}]; p != nil {
		return p, nil
	}
	p, err := r.c.CoreV1().Pods(ns).Get(r.ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		if err := r.namespace(ns); err != nil {
			return nil, err
		}
		return nil, errorf("pod %s/%s not found", ns, name)
	}
	if err != nil {
		return nil, err
	}
	r.keepPod(p)
	return p, nil
}

func (r *reader) keepPod(p *v1.Pod) {
	k := types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
	if r.pod[k] == nil {
		r.pod[k] = p
		r.in.Pods = append(r.in.Pods, p)
	}
}

// namespace reads a namespace once; an *Error when there is none.
func (r *reader) namespace(name string) error {
	if _, ok := r.ns[name]; ok {
		if r.ns[name] == nil {
			return errorf("namespace %s not found", name)
		}
		return nil
	}
	n, err := r.c.CoreV1().Namespaces().Get(r.ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		r.ns[name] = nil
		return errorf("namespace %s not found", name)
	}
	if err != nil {
		return err
	}
	r.ns[name] = n
	r.in.Namespaces = append(r.in.Namespaces, n)
	return nil
}

// podByIP is the pod with address a (a running one first), by field
// selector: the API server filters.
func (r *reader) podByIP(a netip.Addr) (*v1.Pod, error) {
	l, err := r.c.CoreV1().Pods("").List(r.ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("status.podIP", a.String()).String()})
	if err != nil {
		return nil, fmt.Errorf("listing pods of address %s: %w", a, err)
	}
	var found *v1.Pod
	for i := range l.Items {
		p := &l.Items[i]
		if p.Spec.HostNetwork {
			continue
		}
		if found == nil || podActive(p) {
			found = p
		}
	}
	return found, nil
}

func (r *reader) destination() error {
	to := r.q.To
	switch {
	case strings.HasPrefix(to, "svc/"):
		ns, name, ok := strings.Cut(strings.TrimPrefix(to, "svc/"), "/")
		if !ok {
			ns, name = r.q.Namespace, strings.TrimPrefix(to, "svc/")
		}
		if ns == "" || name == "" {
			return errorf("--to=%s: give svc/NAMESPACE/NAME", to)
		}
		return r.service(ns, name)
	case strings.Contains(to, "/"):
		ns, name := r.split(to)
		p, err := r.getPod(ns, name)
		if err != nil {
			return err
		}
		r.in.ToPod = p
		return nil
	}
	if a, err := netip.ParseAddr(to); err == nil {
		return r.address(a.Unmap())
	}
	return r.name(to)
}

func (r *reader) service(ns, name string) error {
	s, err := r.c.CoreV1().Services(ns).Get(r.ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		if err := r.namespace(ns); err != nil {
			return err
		}
		return errorf("Service %s/%s not found", ns, name)
	}
	if err != nil {
		return err
	}
	r.in.ToService = s
	return r.endpoints(s)
}

// endpoints reads the Service's slices and their pods: one List by the
// Service's selector, Gets for the others.
func (r *reader) endpoints(s *v1.Service) error {
	sel := labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: s.Name}).String()
	l, err := r.c.DiscoveryV1().EndpointSlices(s.Namespace).List(r.ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return fmt.Errorf("listing the EndpointSlices of Service %s/%s: %w", s.Namespace, s.Name, err)
	}
	r.in.Slices = nil
	for i := range l.Items {
		r.in.Slices = append(r.in.Slices, &l.Items[i])
	}
	if len(s.Spec.Selector) > 0 {
		pods, err := r.c.CoreV1().Pods(s.Namespace).List(r.ctx, metav1.ListOptions{LabelSelector: labels.SelectorFromSet(s.Spec.Selector).String()})
		if err != nil {
			return fmt.Errorf("listing the pods of Service %s/%s: %w", s.Namespace, s.Name, err)
		}
		for i := range pods.Items {
			r.keepPod(&pods.Items[i])
		}
	}
	for _, sl := range r.in.Slices {
		for _, e := range sl.Endpoints {
			if t := e.TargetRef; t != nil && t.Kind == "Pod" && r.pod[types.NamespacedName{Namespace: t.Namespace, Name: t.Name}] == nil {
				if _, err := r.getPod(t.Namespace, t.Name); err != nil {
					var ee *Error
					if errors.As(err, &ee) {
						continue // gone since: the slice will follow
					}
					return err
				}
			}
		}
	}
	return nil
}

// address finds what an address is: a node's, a pod's, a Service's
// (ClusterIP, externalIP, load balancer), or none in the cluster.
func (r *reader) address(a netip.Addr) error {
	r.in.ToIP = a
	if n := r.nodeOf(a); n != "" {
		r.in.ToNode = n
		if r.q.Port.Number != 0 {
			// A NodePort? The one Service with that node port.
			return r.serviceWhere(func(s *v1.Service) bool {
				return slices.ContainsFunc(s.Spec.Ports, func(p v1.ServicePort) bool { return int(p.NodePort) == r.q.Port.Number })
			}, false)
		}
		return nil
	}
	p, err := r.podByIP(a)
	if err != nil {
		return err
	}
	if p != nil {
		r.in.ToPod = p
		r.keepPod(p)
		return nil
	}
	return r.serviceWhere(func(s *v1.Service) bool { return serviceHas(s, a) }, true)
}

// serviceWhere finds the Service match accepts, listing Services: the
// one question that needs them all. must: an address of a pod CIDR or a
// Service CIDR that is nothing's is an error.
func (r *reader) serviceWhere(match func(*v1.Service) bool, must bool) error {
	l, err := r.c.CoreV1().Services("").List(r.ctx, metav1.ListOptions{ResourceVersion: "0"})
	if err != nil {
		return fmt.Errorf("listing Services: %w", err)
	}
	for i := range l.Items {
		if s := &l.Items[i]; match(s) {
			r.in.ToService = s
			return r.endpoints(s)
		}
	}
	if !must {
		return nil
	}
	a := r.in.ToIP
	for _, n := range r.in.Nodes {
		for _, c := range append([]string{n.Spec.PodCIDR}, n.Spec.PodCIDRs...) {
			if p, err := netip.ParsePrefix(c); err == nil && p.Contains(a) {
				return errorf("address %s belongs to no pod (it is in node %s's pod CIDR %s)", a, n.Name, p)
			}
		}
	}
	if cidrs, err := r.c.NetworkingV1().ServiceCIDRs().List(r.ctx, metav1.ListOptions{}); err == nil {
		for _, sc := range cidrs.Items {
			for _, c := range sc.Spec.CIDRs {
				if p, err := netip.ParsePrefix(c); err == nil && p.Contains(a) {
					return errorf("address %s belongs to no Service (it is in the Service CIDR %s)", a, p)
				}
			}
		}
	}
	return nil // outside the cluster
}

func serviceHas(s *v1.Service, a netip.Addr) bool {
	has := func(ss []string) bool {
		return slices.ContainsFunc(ss, func(x string) bool { b, err := netip.ParseAddr(x); return err == nil && b.Unmap() == a })
	}
	if has(s.Spec.ClusterIPs) || has([]string{s.Spec.ClusterIP}) || has(s.Spec.ExternalIPs) {
		return true
	}
	for _, ing := range s.Status.LoadBalancer.Ingress {
		if has([]string{ing.IP}) {
			return true
		}
	}
	return false
}

// name resolves a DNS name as the source pod's resolver would, asking the
// DNS role's answer logic about the Services the candidates can name.
func (r *reader) name(name string) error {
	domain := r.q.ClusterDomain
	if domain == "" {
		domain = "cluster.local"
	}
	zone := dns.NewZone(domain, "disabled", "kube-system/kube-dns")
	search, ndots := []string(nil), 1
	if p := r.in.FromPod; p != nil {
		s, n, ok := SearchPath(p, domain)
		if ok {
			search, ndots = s, n
		}
	}
	cands := Candidates(name, search, ndots)
	var svcs []*v1.Service
	slices := map[types.NamespacedName][]*discoveryv1.EndpointSlice{}
	var nss []string
	for _, k := range ServicesNamed(cands, zone) {
		s, err := r.c.CoreV1().Services(k.Namespace).Get(r.ctx, k.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return err
		}
		svcs = append(svcs, s)
		nss = append(nss, s.Namespace)
		if err := r.endpoints(s); err != nil {
			return err
		}
		slices[k] = r.in.Slices
	}
	v6 := r.in.FromPod != nil && len(r.in.FromPod.Status.PodIPs) > 0 && strings.Contains(r.in.FromPod.Status.PodIPs[0].IP, ":")
	res := Resolve(zone, dns.IndexOf(svcs, slices, nss), name, cands, search, ndots, v6)
	r.in.Resolution = res
	if res.Address == "" {
		last := res.Tried[len(res.Tried)-1]
		return errorf("name %s does not resolve in the cluster: %s answers %s (names outside %s go upstream; give the address)", name, last.Name, last.Rcode, domain)
	}
	a := netip.MustParseAddr(res.Address)
	r.in.ToService, r.in.Slices = nil, nil
	for _, s := range svcs {
		if serviceHas(s, a) {
			r.in.ToService, r.in.ToIP, r.in.Slices = s, a, slices[types.NamespacedName{Namespace: s.Namespace, Name: s.Name}]
			return nil
		}
	}
	return r.address(a) // a headless Service's pod
}

// policies reads the namespaces of every pod the question holds and the
// NetworkPolicies in them.
func (r *reader) policies() error {
	seen := map[string]bool{}
	for _, p := range r.in.Pods {
		if seen[p.Namespace] {
			continue
		}
		seen[p.Namespace] = true
		if err := r.namespace(p.Namespace); err != nil {
			return err
		}
		l, err := r.c.NetworkingV1().NetworkPolicies(p.Namespace).List(r.ctx, metav1.ListOptions{})
		if err != nil {
			return fmt.Errorf("listing the NetworkPolicies of namespace %s: %w", p.Namespace, err)
		}
		for i := range l.Items {
			r.in.Policies = append(r.in.Policies, &l.Items[i])
		}
	}
	return nil
}
