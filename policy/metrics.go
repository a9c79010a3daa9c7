package policy

import (
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/netplane/netplane/nft"
)

// metrics are the feature's Prometheus metrics, prefixed
// netplane_network_policy_. A sync's duration, failures and time are the
// node role's family (nodeview.Loop), labelled feature="network-policy".
type metrics struct {
	policies prometheus.Gauge
	isolated prometheus.Gauge
	invalid  prometheus.Gauge
	denied   *deniedCollector
}

// newMetrics makes the metrics, unregistered (collectors).
func newMetrics() *metrics {
	return &metrics{
		policies: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "netplane_network_policy_policies",
			Help: "NetworkPolicies programmed at the last sync (those that compiled).",
		}),
		isolated: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "netplane_network_policy_selected_pods",
			Help: "Pods of this node selected by a policy (isolated by a NetworkPolicy or selected by a ClusterNetworkPolicy in at least one direction) at the last sync.",
		}),
		invalid: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "netplane_network_policy_invalid_policies",
			Help: "NetworkPolicies whose last version does not compile (their previous version, if any, stays in force).",
		}),
		denied: &deniedCollector{desc: prometheus.NewDesc("netplane_network_policy_denied_packets_total",
			"Packets dropped by NetworkPolicy on this node, by direction, read from the table's counters.", []string{"direction"}, nil)},
	}
}

// collectors are the metrics to register.
func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.policies, m.isolated, m.invalid, m.denied}
}

// deniedCollector reads the deny chains' counters from the kernel when
// scraped. A counter starts again from 0 when its chain is rewritten, so
// what it counted before is carried over.
type deniedCollector struct {
	desc *prometheus.Desc
	read func() ([2]uint64, error) // packets per Direction; nil: not enforcing

	mu         sync.Mutex
	last, base [2]uint64
}

func (c *deniedCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *deniedCollector) Collect(ch chan<- prometheus.Metric) {
	if c.read == nil {
		return
	}
	got, err := c.read()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, d := range directions {
		if err == nil {
			if got[d] < c.last[d] {
				c.base[d] += c.last[d]
			}
			c.last[d] = got[d]
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(c.base[d]+c.last[d]), d.String())
	}
}

// deniedPackets reads the packets NetworkPolicy's deny chains counted.
func deniedPackets(pc nft.PacketCounter) func() ([2]uint64, error) {
	return deniedPacketsIn(pc, func(d Direction) []string { return []string{denyChain(d)} })
}

// deniedPacketsIn reads the packets the deny chains (chains says which,
// by direction) counted, through the driver that programs the table.
func deniedPacketsIn(pc nft.PacketCounter, chains func(Direction) []string) func() ([2]uint64, error) {
	return func() ([2]uint64, error) {
		var out [2]uint64
		var all [2][]string
		for _, d := range directions {
			all[d] = chains(d)
		}
		n, err := pc.Packets(append(all[Ingress], all[Egress]...)...)
		if err != nil {
			return out, fmt.Errorf("reading the deny chains' counters: %w", err)
		}
		for _, d := range directions {
			for _, c := range all[d] {
				out[d] += n[c]
			}
		}
		return out, nil
	}
}
