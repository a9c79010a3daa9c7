package policy

import (
	"maps"
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/netplane/netplane/nodeview"
)

// This file keeps the address sets of the nodes peer of
// ClusterNetworkPolicy egress rules: one set per family for each distinct
// node selector (node-…), holding the addresses in status.addresses of the
// Nodes it selects. A Node change touches the elements of the selectors
// it enters or leaves.

// Node is what policy needs of a Node: its labels and addresses.
type Node struct {
	Name   string
	Labels map[string]string
	IPs    []netip.Addr
}

// GetObjectMeta is the record's key, for the informer layer.
func (n *Node) GetObjectMeta() metav1.Object { return &metav1.ObjectMeta{Name: n.Name} }

// NodeFromAPI reduces an API Node to its record: every address of
// status.addresses that is an IP address (InternalIP, ExternalIP).
func NodeFromAPI(n *v1.Node) *Node {
	r := &Node{Name: n.Name, Labels: n.Labels}
	for _, a := range n.Status.Addresses {
		if ip, err := netip.ParseAddr(strings.TrimSpace(a.Address)); err == nil && !slices.Contains(r.IPs, ip.Unmap()) {
			r.IPs = append(r.IPs, ip.Unmap())
		}
	}
	return r
}

// nodeSel is a node selector in use.
type nodeSel struct {
	ns   *NodeSelector
	hash string
	refs int
}

// UpsertNode adds or changes a Node.
func (m *Model) UpsertNode(rec *Node) {
	cl := m.cluster()
	old := cl.nodes[rec.Name]
	if old != nil && maps.Equal(old.Labels, rec.Labels) && slices.Equal(old.IPs, rec.IPs) {
		return
	}
	cl.nodes[rec.Name] = rec
	for _, n := range cl.nodeSels {
		if old != nil {
			m.nodeElems(n, old, m.delElem)
		}
		m.nodeElems(n, rec, m.addElem)
	}
}

// DeleteNode removes a Node.
func (m *Model) DeleteNode(name string) {
	cl := m.cluster()
	old := cl.nodes[name]
	if old == nil {
		return
	}
	delete(cl.nodes, name)
	for _, n := range cl.nodeSels {
		m.nodeElems(n, old, m.delElem)
	}
}

// nodeElems calls fn with the elements rec gives n's sets, if n selects it.
func (m *Model) nodeElems(n *nodeSel, rec *Node, fn func(string, Element)) {
	if !n.ns.Labels.Matches(labels.Set(rec.Labels)) {
		return
	}
	for _, a := range rec.IPs {
		if m.family(a) {
			fn(setName("node", nodeview.FamilyOf(a), n.hash), Element{Addr: a})
		}
	}
}

func (m *Model) acquireNodeSel(ns *NodeSelector) *nodeSel {
	cl := m.cluster()
	if n := cl.nodeSels[ns.Key]; n != nil {
		n.refs++
		return n
	}
	n := &nodeSel{ns: ns, hash: hashOf(ns.Key), refs: 1}
	cl.nodeSels[ns.Key] = n
	for _, f := range m.fams {
		m.putSet(newSet(setName("node", f, n.hash), f, AddrSet))
	}
	for _, rec := range cl.nodes {
		m.nodeElems(n, rec, m.addElem)
	}
	return n
}

func (m *Model) releaseNodeSel(n *nodeSel) {
	if n.refs--; n.refs > 0 {
		return
	}
	delete(m.cl.nodeSels, n.ns.Key)
	for _, f := range m.fams {
		m.dropSet(setName("node", f, n.hash))
	}
}
