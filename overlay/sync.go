package overlay

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/netplane/netplane/cni/link"
)

// Syncer converges the kernel of one network namespace (that of its
// netlink handle) to the plan. Every Sync reads the kernel afresh and
// rewrites only what differs, so it is both the reaction to a Node change
// and the periodic full resync that heals entries someone else deleted.
// Nothing is removed when the caller stops: devices, routes and entries
// stay, and connections through them survive a restart. Not safe for
// concurrent use: one caller loop owns it.
type Syncer struct {
	h       *netlink.Handle
	cfg     Config
	metrics *Metrics // nil: none
}

// NewSyncer checks cfg (after Defaults) and returns a Syncer writing
// through h. metrics may be nil.
func NewSyncer(h *netlink.Handle, cfg Config, metrics *Metrics) (*Syncer, error) {
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
func (s *Syncer) Sync(self string, nodes []Node) (Plan, error) {
	start := time.Now()
	routes, err := mainRoutes(s.h)
	if err != nil {
		return Plan{}, err
	}
	tunnels, err := tunnelIndexes(s.h)
	if err != nil {
		return Plan{}, err
	}
	in := Input{Config: s.cfg, Self: self, Nodes: nodes}
	i := slices.IndexFunc(nodes, func(n Node) bool { return n.Name == self })
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

	err = s.converge(plan, routes)
	if s.metrics != nil {
		s.metrics.observe(plan, err, start)
	}
	return plan, err
}

// converge writes plan, given the main table as read before the devices
// were touched.
func (s *Syncer) converge(plan Plan, routes []netlink.Route) error {
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
			return errors.Join(append(errs, err)...)
		}
	}
	c, err := s.diff(plan, routes, tunnels)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	errs = append(errs, c.apply(s.h))
	for _, name := range []string{DeviceV4, DeviceV6} {
		if !planned(plan, name) {
			errs = append(errs, deleteDevice(s.h, name))
		}
	}
	return errors.Join(errs...)
}

// diff reads the entries of the tunnel devices and compares everything
// with the plan.
func (s *Syncer) diff(plan Plan, routes []netlink.Route, tunnels map[string]int) (*changes, error) {
	c := &changes{}
	var ours []netlink.Route
	for _, r := range routes {
		if r.Protocol == RouteProtocol {
			ours = append(ours, r)
		}
	}
	c.diffRoutes(ours, plan.Routes, tunnels)
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
