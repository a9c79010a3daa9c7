package wireguard

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestMetricsOfASync(t *testing.T) {
	m := NewMetrics()
	m.Running(Userspace)
	m.Observe(Stats{Up: 2, Stale: 1, NoKey: 3, TxBytes: 100, RxBytes: 200})
	m.Observe(Stats{Up: 2, Stale: 1, NoKey: 3, TxBytes: 150, RxBytes: 250})
	want := `
# HELP netplane_wireguard_implementation 1 for the WireGuard implementation that runs: kernel or userspace.
# TYPE netplane_wireguard_implementation gauge
netplane_wireguard_implementation{implementation="kernel"} 0
netplane_wireguard_implementation{implementation="userspace"} 1
# HELP netplane_wireguard_peers Other nodes by WireGuard state: up (handshake within 3 minutes), stale, rejected (no valid key: their pod traffic is dropped).
# TYPE netplane_wireguard_peers gauge
netplane_wireguard_peers{state="rejected"} 3
netplane_wireguard_peers{state="stale"} 1
netplane_wireguard_peers{state="up"} 2
# HELP netplane_wireguard_bytes Bytes through the WireGuard device since it started, all peers, by direction (sent, received).
# TYPE netplane_wireguard_bytes gauge
netplane_wireguard_bytes{direction="received"} 250
netplane_wireguard_bytes{direction="sent"} 150
`
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m.Collectors()...)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}
