package policy

import (
	"fmt"
	"testing"
	"time"

	"github.com/netplane/netplane/e2e/framework"
)

// vsAlternations is how many times vsMeasureAlternating goes from no
// policy to the scale's policies.
const vsAlternations = 24

// vsMeasureAlternating measures what the scale's policies cost a packet
// against no policy at all, on the same pods, nodes and enforcer
// processes: it deletes every policy and creates them again, vsAlternations
// times, and measures the paths in each state. Figures taken minutes apart
// on fresh nodes (the scales' own runs) differ by more than the bound
// asks to resolve on a shared machine; alternating spreads the machine's
// drift over both states alike. Each state is measured once the probe's
// denied port has flipped on the server's node (open without policies,
// closed with them) and both enforcers are idle: 4,000 connects and one
// one-second stream on each pair. A connect's p99 is set by rare stalls
// of this shared machine, which come in bursts: many short states, 96,000
// connects and 24 streams each, share them out more evenly than a few
// long ones. It ends with the scale's policies in place.
func vsMeasureAlternating(b *testing.B, e vsEnforcer, c *vsCluster, top *vsTopology, procs [2]*framework.Process, n int, r *vsResult) {
	for range vsAlternations {
		for k, with := range []bool{false, true} {
			c.setPolicies(b, map[bool]int{true: n}[with])
			if _, err := vsFlip(top.client, vsClient, vsServerPort(vsDeniedPort), !with, time.Minute, procs[1]); err != nil {
				b.Fatalf("%s, alternating %d policies (with them: %v): %v; log tail:\n%s", e.name, n, with, err, procs[1].Tail(20))
			}
			for _, p := range procs {
				vsWaitIdle(b, e, p, 300*time.Millisecond, 10*time.Minute)
			}
			vsMeasurePath(b, top, &r.alt[k], 40, 1)
		}
	}
}

// vsAlternatingLine reports the alternating figures, with the policies
// against without them (both zero when not measured).
func vsAlternatingLine(name string, n int, r *vsResult) string {
	off, on := r.alt[0], r.alt[1]
	if len(off.lat) == 0 || len(on.lat) == 0 {
		return ""
	}
	ratio := func(a, b time.Duration) float64 { return a.Seconds() / b.Seconds() }
	return fmt.Sprintf("%s: alternating %d policies and none %d times in the same processes: connect p50 %v vs %v (%.2fx), p99 %v vs %v (%.2fx) (bound: at most 1.1x); the open pair p50 %.2fx, p99 %.2fx; stream %.2f vs %.2f Gbit/s (%.3fx; bound: at least 0.95x), the open pair %.3fx",
		name, n, vsAlternations,
		vsPercentile(on.lat, 50), vsPercentile(off.lat, 50), ratio(vsPercentile(on.lat, 50), vsPercentile(off.lat, 50)),
		vsPercentile(on.lat, 99), vsPercentile(off.lat, 99), ratio(vsPercentile(on.lat, 99), vsPercentile(off.lat, 99)),
		ratio(vsPercentile(on.latOpen, 50), vsPercentile(off.latOpen, 50)), ratio(vsPercentile(on.latOpen, 99), vsPercentile(off.latOpen, 99)),
		vsMedian(on.tput)/1e9, vsMedian(off.tput)/1e9, vsMedian(on.tput)/vsMedian(off.tput), vsMedian(on.tputOpen)/vsMedian(off.tputOpen))
}
