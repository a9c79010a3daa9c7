package overlay

import (
	"errors"
	"fmt"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/netplane/netplane/link"
	"github.com/netplane/netplane/nodeview"
)

// Syncer converges the kernel of one network namespace (its Kernel: a
// netlink handle, or FakeKernel) to the plan. Sync reads the kernel afresh and rewrites
// only what differs: the first sync and the periodic full resync that
// heals entries someone else deleted. SyncChanged applies the change of a
// few Nodes from the plan of the last sync, without reading the kernel.
// Nothing is removed when the caller stops: devices, routes and entries
// stay, and connections through them survive a restart. Not safe for
// concurrent use: one caller loop owns it.
type Syncer struct {
	h       Kernel
	cfg     Config
	metrics *Metrics // nil: none

	// Of the last sync that succeeded; last.in.Nodes holds this node
	// only. valid is false before one and after any failure.
	last struct {
		valid   bool
		in      Input
		plan    Plan
		tunnels map[string]int
	}
}

// NewSyncer checks cfg (after Defaults) and returns a Syncer writing
// through h. metrics may be nil.
func NewSyncer(h Kernel, cfg Config, metrics *Metrics) (*Syncer, error) {
	cfg = cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Syncer{h: h, cfg: cfg, metrics: metrics}, nil
}

// Sync makes the kernel match the plan for this node (self) and nodes, and
// returns the plan: its Decisions say the path to every other node, and
// Unroutable the nodes the caller should warn about. On error the plan is
// still returned; whatever could be written was.
func (s *Syncer) Sync(self string, nodes []nodeview.Node) (Plan, error) {
	routes, err := mainRoutes(s.h)
	if err != nil {
		return Plan{}, err
	}
	tunnels, err := tunnelIndexes(s.h)
	if err != nil {
		return Plan{}, err
	}
	in := Input{Config: s.cfg, Self: self, Nodes: nodes}
	i := slices.IndexFunc(nodes, func(n nodeview.Node) bool { return n.Name == self })
	if i < 0 {
		// Without this node's facts there is no underlay, and the plan
		// would remove the tunnels: more likely a cache not yet filled or a
		// wrong node name than a node that left its own cluster.
		return Plan{}, fmt.Errorf("node %q is not among the %d nodes: nothing changed (check the node name)", self, len(nodes))
	}
	if in.Underlays, err = underlays(s.h, nodes[i]); err != nil {
		return Plan{}, err
	}
	skip := map[int]bool{}
	for _, idx := range tunnels {
		skip[idx] = true
	}
	in.Connected = ConnectedPrefixes(routes, skip)
	plan := Desired(in)

	tunnels, err = s.converge(plan, routes)
	s.remember(err == nil, in, nodes[i], plan, tunnels)
	if s.metrics != nil {
		s.metrics.observe(plan)
	}
	return plan, err
}

func (s *Syncer) remember(ok bool, in Input, self nodeview.Node, plan Plan, tunnels map[string]int) {
	s.last.valid = ok
	in.Nodes = []nodeview.Node{self}
	s.last.in, s.last.plan, s.last.tunnels = in, plan, tunnels
}

// forget makes the next SyncChanged a Sync: for a caller that took
// changes it did not apply.
func (s *Syncer) forget() { s.last.valid = false }

// manyChanged says when SyncChanged runs Sync instead: more than eight
// changed Nodes at once (a relist after a lost watch, a renumbering), or
// more than half of them. Each Update scans and sorts the whole plan:
// beside 1,000 Nodes, 16 of them took 15.9 ms, a full sync 11.5 ms
// (BenchmarkSync). One changed Node always takes the delta.
func manyChanged(changed, nodes int) bool {
	return changed > 8 || changed > 1 && 2*changed > nodes
}

// SyncChanged makes the kernel follow a change of the Nodes named in
// changed (a name not among nodes: the Node is gone) by writing only the
// entries that change (Update), with nothing read back from the kernel.
// It falls back to Sync when Update needs the whole plan, when this
// node's facts changed, when many Nodes changed (manyChanged), and when
// the last sync failed or there was none.
func (s *Syncer) SyncChanged(self string, nodes []nodeview.Node, changed []string) (Plan, error) {
	byName := make(map[string]int, len(nodes))
	for i, n := range nodes {
		byName[n.Name] = i
	}
	i, found := byName[self]
	if s.cfg.Off || !s.last.valid || !found || !sameNode(s.last.in.Nodes[0], nodes[i]) || manyChanged(len(changed), len(nodes)) {
		return s.Sync(self, nodes)
	}
	plan := s.last.plan
	for _, name := range changed {
		j, present := byName[name]
		n := nodeview.Node{Name: name}
		if present {
			n = nodes[j]
		}
		next, _, ok := Update(plan, s.last.in, n, !present)
		if !ok {
			return s.Sync(self, nodes)
		}
		plan = next
	}
	// One delta over all the changed nodes: an address one node left and
	// another took is then one entry kept, not a set and a delete.
	delta := Diff(s.last.plan.of(changed...), plan.of(changed...))
	err := deltaChanges(delta, s.last.tunnels).apply(s.h)
	s.last.valid, s.last.plan = err == nil, plan
	if s.metrics != nil {
		s.metrics.observe(plan)
	}
	return plan, err
}

func sameNode(a, b nodeview.Node) bool {
	return a.Name == b.Name && slices.Equal(a.IPs, b.IPs) && slices.Equal(a.PodCIDRs, b.PodCIDRs)
}

// converge writes plan, given the main table as read before the devices
// were touched, and returns the indexes of the tunnel devices.
func (s *Syncer) converge(plan Plan, routes []netlink.Route) (map[string]int, error) {
	var errs []error
	tunnels := map[string]int{}
	recreated := false
	for _, d := range plan.Devices {
		created, err := ensureDevice(s.h, d)
		recreated = recreated || created
		errs = append(errs, err)
		if l, err := s.h.LinkByName(d.Name); err == nil {
			tunnels[d.Name] = l.Attrs().Index
		}
	}
	if recreated {
		// A new device takes the routes through the old one with it.
		var err error
		if routes, err = mainRoutes(s.h); err != nil {
			return tunnels, errors.Join(append(errs, err)...)
		}
	}
	c, err := s.diff(plan, routes, tunnels)
	if err != nil {
		return tunnels, errors.Join(append(errs, err)...)
	}
	errs = append(errs, c.apply(s.h))
	for _, name := range []string{DeviceV4, DeviceV6} {
		if !planned(plan, name) {
			errs = append(errs, deleteDevice(s.h, name))
		}
	}
	return tunnels, errors.Join(errs...)
}

// diff reads the entries of the tunnel devices and compares everything
// with the plan.
func (s *Syncer) diff(plan Plan, routes []netlink.Route, tunnels map[string]int) (*changes, error) {
	c := &changes{}
	c.diffRoutes(owned(routes), plan.Routes, tunnels)
	for _, d := range plan.Devices {
		idx, ok := tunnels[d.Name]
		if !ok {
			continue
		}
		fdb, err := link.Retry(func() ([]netlink.Neigh, error) { return s.h.NeighList(idx, unix.AF_BRIDGE) })
		if err != nil {
			return nil, fmt.Errorf("list fdb of %s: %w", d.Name, err)
		}
		neigh, err := link.Retry(func() ([]netlink.Neigh, error) { return s.h.NeighList(idx, families[d.Family]) })
		if err != nil {
			return nil, fmt.Errorf("list neighbours of %s: %w", d.Name, err)
		}
		c.diffFDB(fdb, idx, entriesOn(plan.FDB, d.Name))
		c.diffNeighbours(neigh, idx, entriesOn(plan.Neighbours, d.Name))
	}
	return c, nil
}

func planned(p Plan, device string) bool {
	for _, d := range p.Devices {
		if d.Name == device {
			return true
		}
	}
	return false
}

// entriesOn are the entries of one device.
func entriesOn[E interface{ device() string }](all []E, device string) []E {
	var out []E
	for _, e := range all {
		if e.device() == device {
			out = append(out, e)
		}
	}
	return out
}

func (n Neighbour) device() string { return n.Device }
func (f FDBEntry) device() string  { return f.Device }
