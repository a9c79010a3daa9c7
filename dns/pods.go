package dns

import (
	"hash/maphash"
	"net/netip"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/netplane/netplane/internal/intern"
)

// podSink is the pods' view (a Sink): autopath and verified pod records
// need only which namespace holds an address, so rather than an informer
// cache of every pod (tens of thousands in a large cluster) it keeps each
// pod's addresses, the least that says what a pod gives back when it
// changes or goes, and hands every move to the watcher. It takes a list as
// it arrives (informer.ListSink), so a relist holds no list of every pod;
// only the moves of the pods whose addresses changed wait for its end.
type podSink struct {
	mu   sync.Mutex
	pods podStore
	// listing: a list is open; its moves wait in held until it ends, so
	// that the index is rebuilt once for the whole list, as it is once for
	// a watch event.
	listing bool
	held    []podMove
	moves   func([]podMove)
	// listed, when set, is told once a list has been applied.
	listed func()
	// chunk, when set, is told as a list opens and after every listChunk
	// pods of it, outside the sink's lock.
	chunk   func()
	inChunk int // pods of the open list since chunk was last told
	// relist, when set, is told as a list opens after one has ended (an
	// API server restart, a watch too old to resume), outside the lock.
	relist func()
	ended  bool // a list has ended
}

// listChunk is how many listed pods the sink takes between two calls of
// its chunk.
const listChunk = 1000

// podMove is a pod of namespace ns giving back the addresses old and
// taking cur.
type podMove struct {
	ns       string
	old, cur []netip.Addr
}

func newPodSink(moves func([]podMove)) *podSink {
	return &podSink{pods: newPodStore(), moves: moves}
}

// podSeed seeds podKey. Two pods of 150,000 share a key with odds of one
// in 10^9, different in each process; such a pair would hand on each
// other's moves, as one pod that changed its addresses.
var podSeed = maphash.MakeSeed()

// podKey is the key a pod is kept under: a hash of its namespace and name,
// which may hold neither '/' nor NUL.
func podKey(ns, name string) uint64 {
	var h maphash.Hash
	h.SetSeed(podSeed)
	h.WriteString(ns)
	h.WriteByte(0)
	h.WriteString(name)
	return h.Sum64()
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
		cur = p.addrs
	}
	s.mu.Lock()
	k := podKey(p.ns, p.name)
	_, old := s.pods.get(k)
	s.pods.put(k, p.ns, cur)
	if old != cur {
		s.move(podMove{p.ns, old.unpack(), cur.unpack()})
	}
	full := false
	if s.listing {
		s.inChunk++
		if full = s.inChunk == listChunk; full {
			s.inChunk = 0
		}
	}
	s.mu.Unlock()
	if full {
		s.tellChunk()
	}
	return nil
}

func (s *podSink) tellChunk() {
	if s.chunk != nil {
		s.chunk()
	}
}

// move hands m on, or holds it until the open list ends.
func (s *podSink) move(m podMove) {
	if s.listing {
		s.held = append(s.held, m)
	} else {
		s.moves([]podMove{m})
	}
}

// BeginList opens a list: the pods it names from now on are marked with
// its epoch.
func (s *podSink) BeginList() {
	s.mu.Lock()
	s.pods.begin()
	s.listing, s.inChunk = true, 0
	again := s.ended
	s.mu.Unlock()
	if again && s.relist != nil {
		s.relist()
	}
	s.tellChunk()
}

// EndList closes the list: each pod it did not name gives its addresses
// back, and the list's moves are handed on at once.
func (s *podSink) EndList(string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pods.sweep(func(ns string, addrs packedAddrs) {
		s.held = append(s.held, podMove{ns, addrs.unpack(), nil})
	})
	moves := s.held
	s.held, s.listing, s.ended = nil, false, true
	s.moves(moves)
	if s.listed != nil {
		s.listed()
	}
	return nil
}

// Replace makes list the whole set of pods, as one list: each differing
// pod moves, and each pod missing from it gives its addresses back.
func (s *podSink) Replace(list []any, rv string) error {
	s.BeginList()
	for _, obj := range list {
		_ = s.Add(obj)
	}
	return s.EndList(rv)
}

// namespaceIDs number the namespaces of the pods, for a pod to name its
// own in four bytes.
type namespaceIDs struct {
	names []string
	ids   map[string]uint32
}

func newNamespaceIDs() namespaceIDs { return namespaceIDs{ids: map[string]uint32{}} }

func (n *namespaceIDs) id(ns string) uint32 {
	id, ok := n.ids[ns]
	if !ok {
		id = uint32(len(n.names))
		n.names = append(n.names, ns)
		n.ids[ns] = id
	}
	return id
}

func (n *namespaceIDs) name(id uint32) string { return n.names[id] }

// packedAddrs are a pod's addresses as the sink keeps them, with no
// pointers for the garbage collector to follow and no allocation of their
// own: the API server allows a pod at most one address per family.
type packedAddrs struct {
	v4  [4]byte
	v6  [16]byte
	has uint8 // 1: v4, 2: v6
}

func pack(addrs []netip.Addr) packedAddrs {
	var p packedAddrs
	for _, a := range addrs {
		switch {
		case a.Is4() && p.has&1 == 0:
			p.v4, p.has = a.As4(), p.has|1
		case a.Is6() && p.has&2 == 0:
			p.v6, p.has = a.As16(), p.has|2
		}
	}
	return p
}

func (p packedAddrs) n() int { return int(p.has&1 + p.has>>1&1) }

func (p packedAddrs) unpack() []netip.Addr {
	var out []netip.Addr
	if p.has&1 != 0 {
		out = append(out, netip.AddrFrom4(p.v4))
	}
	if p.has&2 != 0 {
		out = append(out, netip.AddrFrom16(p.v6))
	}
	return out
}

// podInfo is the pods' view's record of a pod, made for each event and
// list item and then dropped: its name and addresses. A store reaches its
// name through GetObjectMeta, which builds the metadata only when asked.
type podInfo struct {
	ns, name string
	addrs    packedAddrs // none once the pod has finished
	// rv and initialEventsEnd are set by the wire reader (podwire.go),
	// whose podInfo is also the watch's object: its version, and whether
	// it is the bookmark that ends a watch-list's initial events.
	rv               string
	initialEventsEnd bool
}

func (p *podInfo) GetObjectMeta() metav1.Object {
	m := &metav1.ObjectMeta{Name: p.name, Namespace: p.ns, ResourceVersion: p.rv}
	if p.initialEventsEnd {
		m.Annotations = map[string]string{metav1.InitialEventsAnnotationKey: "true"}
	}
	return m
}

// GetObjectKind and DeepCopyObject make a podInfo a runtime.Object, which
// a list holds as it is (internal/informer): no wrapper per pod.
func (p *podInfo) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

func (p *podInfo) DeepCopyObject() runtime.Object {
	c := *p
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
		return &podInfo{ns: intern.String(o.Namespace), name: o.Name, addrs: pack(podAddrs(o))}
	}
	return nil
}

// podRecord is the pods' view's Record.
func podRecord(obj runtime.Object) any { return toPodInfo(obj) }

// podAddrs are the addresses of a pod that holds them.
func podAddrs(pod *corev1.Pod) []netip.Addr {
	ips := make([]string, len(pod.Status.PodIPs))
	for i, ip := range pod.Status.PodIPs {
		ips[i] = ip.IP
	}
	return statusAddrs(pod.Status.Phase, pod.Status.PodIP, ips)
}

// statusAddrs are the addresses a pod's status gives it (podIPs, or podIP
// alone), none once it has finished: a finished pod has given its
// addresses back, and they may already be another pod's.
func statusAddrs(phase corev1.PodPhase, podIP string, podIPs []string) []netip.Addr {
	if phase == corev1.PodSucceeded || phase == corev1.PodFailed {
		return nil
	}
	if len(podIPs) == 0 && podIP != "" {
		podIPs = []string{podIP}
	}
	var out []netip.Addr
	for _, ip := range podIPs {
		if a, err := netip.ParseAddr(ip); err == nil {
			out = append(out, a.Unmap())
		}
	}
	return out
}
