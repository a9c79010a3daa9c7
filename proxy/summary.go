package proxy

import (
	"maps"
	"net/netip"
)

// The model's summaries (Desired's Health, UDP and no-local counts) follow
// the fragments as they come and go, so a partial sync costs what the
// changed Services hold: recomputing them from every fragment was most of
// Model.Apply for one change, 0.58 ms of it at 10,000 Services
// (BenchmarkBuildOneChange/10000/told, 2026-12-02, load 18).
//
// The caller keeps the maps a sync handed it (the health servers read them,
// the UDP conntrack cleaner compares the next ones with them), so a map is
// copied before its first change after being handed out (own).

// summaries are the model's bookkeeping behind Desired's summaries.
type summaries struct {
	// udpBy are the fragments serving each UDP address: two Services may
	// share one (an external IP and port), and the address's endpoints
	// are then the union of theirs.
	udpBy map[netip.AddrPort][]*fragment
	// ownHealth and ownUDP: the map in Desired was made or copied since it
	// was last handed out.
	ownHealth, ownUDP bool
}

func newSummaries() summaries {
	return summaries{udpBy: map[netip.AddrPort][]*fragment{}, ownHealth: true, ownUDP: true}
}

// handedOut marks the maps as the caller's: the next change copies them.
func (m *Model) handedOut() { m.sum.ownHealth, m.sum.ownUDP = false, false }

// summaryAdd adds a merged fragment's summaries.
func (m *Model) summaryAdd(f *fragment) {
	m.d.NoLocalInternal += f.d.NoLocalInternal
	m.d.NoLocalExternal += f.d.NoLocalExternal
	if len(f.d.Health) > 0 {
		m.health()
		maps.Copy(m.d.Health, f.d.Health)
	}
	for vip := range f.d.UDP {
		m.sum.udpBy[vip] = append(m.sum.udpBy[vip], f)
		m.mergeUDP(vip)
	}
}

// summaryRemove takes a fragment's summaries out.
func (m *Model) summaryRemove(f *fragment) {
	m.d.NoLocalInternal -= f.d.NoLocalInternal
	m.d.NoLocalExternal -= f.d.NoLocalExternal
	if len(f.d.Health) > 0 {
		m.health()
		for svc := range f.d.Health {
			delete(m.d.Health, svc)
		}
	}
	for vip := range f.d.UDP {
		fs := m.sum.udpBy[vip]
		rest := make([]*fragment, 0, len(fs))
		for _, g := range fs {
			if g != f {
				rest = append(rest, g)
			}
		}
		if len(rest) == 0 {
			delete(m.sum.udpBy, vip)
		} else {
			m.sum.udpBy[vip] = rest
		}
		m.mergeUDP(vip)
	}
}

// mergeUDP sets vip's endpoints from the fragments serving it.
func (m *Model) mergeUDP(vip netip.AddrPort) {
	if !m.sum.ownUDP {
		m.d.UDP, m.sum.ownUDP = maps.Clone(m.d.UDP), true
	}
	switch fs := m.sum.udpBy[vip]; len(fs) {
	case 0:
		delete(m.d.UDP, vip)
	case 1:
		m.d.UDP[vip] = fs[0].d.UDP[vip] // the fragment's, never changed
	default:
		merged := map[netip.AddrPort]bool{}
		for _, f := range fs {
			maps.Copy(merged, f.d.UDP[vip])
		}
		m.d.UDP[vip] = merged
	}
}

// health makes the health-check map the model's own to change.
func (m *Model) health() {
	if !m.sum.ownHealth {
		m.d.Health, m.sum.ownHealth = maps.Clone(m.d.Health), true
	}
}
