package dns

import (
	"net/netip"
	"slices"
	"sync"
	"unique"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// podSink is the pods' view (a Sink): autopath and verified pod records
// need only which namespace holds an address, so rather than an informer
// cache of every pod (tens of thousands in a large cluster) it keeps each
// pod's addresses, the least that says what a pod gives back when it
// changes or goes, and hands every move to the watcher.
type podSink struct {
	mu    sync.Mutex
	addrs map[podRef]podEntry // pods holding addresses
	// epoch numbers the lists: Replace marks each listed pod with the
	// new one, and then the pods still marked with an older one are gone.
	epoch uint8
	moves func([]podMove)
	// listed, when set, is told once a list has been applied.
	listed func()
}

// podEntry is a pod's addresses, and the list that last named the pod.
type podEntry struct {
	addrs packedAddrs
	epoch uint8
}

// podMove is a pod giving back the addresses old and taking cur.
type podMove struct {
	ref      podRef
	old, cur []netip.Addr
}

func newPodSink(moves func([]podMove)) *podSink {
	return &podSink{addrs: map[podRef]podEntry{}, moves: moves}
}

func (s *podSink) Add(obj any) error    { return s.set(obj, true) }
func (s *podSink) Update(obj any) error { return s.set(obj, true) }
func (s *podSink) Delete(obj any) error { return s.set(obj, false) }
func (s *podSink) Resync() error        { return nil }

func (s *podSink) set(obj any, exists bool) error {
	p := toPodInfo(obj)
	if p == nil {
		return nil
	}
	var cur packedAddrs
	if exists {
		cur = pack(p.addrs)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.addrs[p.ref].addrs
	if old == cur {
		return nil
	}
	if cur.n == 0 {
		delete(s.addrs, p.ref)
	} else {
		s.addrs[p.ref] = podEntry{cur, s.epoch}
	}
	s.moves([]podMove{{p.ref, old.unpack(), cur.unpack()}})
	return nil
}

// Replace makes list the whole set of pods: each differing pod moves, and
// each pod missing from it gives its addresses back. It changes the map in
// place: a relist of 150,000 pods would otherwise hold a second map of
// them all beside the first.
func (s *podSink) Replace(list []any, _ string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.epoch++
	var moves []podMove
	for _, obj := range list {
		p := toPodInfo(obj)
		if p == nil || len(p.addrs) == 0 {
			continue
		}
		cur := pack(p.addrs)
		if old := s.addrs[p.ref].addrs; old != cur {
			moves = append(moves, podMove{p.ref, old.unpack(), cur.unpack()})
		}
		s.addrs[p.ref] = podEntry{cur, s.epoch}
	}
	for ref, e := range s.addrs {
		if e.epoch != s.epoch {
			moves = append(moves, podMove{ref, e.addrs.unpack(), nil})
			delete(s.addrs, ref)
		}
	}
	s.moves(moves)
	if s.listed != nil {
		s.listed()
	}
	return nil
}

// packedAddrs are a pod's addresses as the sink keeps them, with no
// pointers for the garbage collector to follow and no allocation of their
// own. A pod has at most one address per family; the API server refuses
// more.
type packedAddrs struct {
	n    uint8
	addr [2][16]byte
}

func pack(addrs []netip.Addr) packedAddrs {
	var p packedAddrs
	for _, a := range addrs[:min(len(addrs), len(p.addr))] {
		p.addr[p.n] = a.As16()
		p.n++
	}
	return p
}

func (p packedAddrs) unpack() []netip.Addr {
	var out []netip.Addr
	for _, a := range p.addr[:p.n] {
		out = append(out, netip.AddrFrom16(a).Unmap())
	}
	return out
}

// podInfo is the pods' view's record of a pod (what its list, and a
// watch-list's temporary store, hold): its name and addresses. A store
// reaches its name through GetObjectMeta, which builds the metadata only
// when asked.
type podInfo struct {
	ref   podRef
	addrs []netip.Addr // none once the pod has finished
}

func (p *podInfo) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Name: p.ref.name, Namespace: p.ref.ns}
}

// GetObjectKind and DeepCopyObject make a podInfo a runtime.Object, which
// a list holds as it is (internal/informer): no wrapper per pod.
func (p *podInfo) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

func (p *podInfo) DeepCopyObject() runtime.Object {
	c := *p
	c.addrs = slices.Clone(p.addrs)
	return &c
}

// toPodInfo reads a Pod, a podInfo or a deleted pod's last state; nil for
// anything else. Namespace names are interned: every pod of a namespace
// shares one copy.
func toPodInfo(obj any) *podInfo {
	switch o := unwrap(obj).(type) {
	case *podInfo:
		return o
	case *corev1.Pod:
		return &podInfo{ref: podRef{unique.Make(o.Namespace).Value(), o.Name}, addrs: podAddrs(o)}
	}
	return nil
}

// podRecord is the pods' view's Record.
func podRecord(obj runtime.Object) any { return toPodInfo(obj) }

// podAddrs are the addresses of a pod that holds them: a finished pod has
// given its addresses back, and they may already be another pod's.
func podAddrs(pod *corev1.Pod) []netip.Addr {
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return nil
	}
	ips := pod.Status.PodIPs
	if len(ips) == 0 && pod.Status.PodIP != "" {
		ips = []corev1.PodIP{{IP: pod.Status.PodIP}}
	}
	var out []netip.Addr
	for _, ip := range ips {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			out = append(out, a.Unmap())
		}
	}
	return out
}
