package dns

import (
	"fmt"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
)

// BenchmarkOneEndpointChange: one endpoint of a headless Service of 250
// (three slices) turns unready and ready again, each a Change of the index
// of 250 such Services and 9,750 of one ClusterIP each, the Services of
// BenchmarkRelistMemory's largest size. What a change copies of the index
// is its cost, in time and in garbage. index-MB is the live heap the
// index and its records take.
func BenchmarkOneEndpointChange(b *testing.B) {
	const headless, others, perService = 250, 9750, 250
	before := liveHeap()
	ix := NewIndex()
	c := ix.Edit()
	sliceOfService := func(i, part int, unready int) *discoveryv1.EndpointSlice {
		var eps []ep
		for j := part * 100; j < min(part*100+100, perService); j++ {
			eps = append(eps, ep{addr: fmt.Sprintf("10.%d.%d.%d", 200+i>>8, i&255, j), host: fmt.Sprintf("web-%d", j), ready: j != unready})
		}
		return slice(fmt.Sprintf("ns-%d", i), fmt.Sprintf("svc-%d-%d", i, part), fmt.Sprintf("svc-%d", i), discoveryv1.AddressTypeIPv4, httpSlicePorts(), eps...)
	}
	build := func(i, unready int) *service {
		var sls []*discoveryv1.EndpointSlice
		for part := 0; part*100 < perService; part++ {
			sls = append(sls, sliceOfService(i, part, unready))
		}
		return buildService(headlessService(fmt.Sprintf("ns-%d", i), fmt.Sprintf("svc-%d", i), httpPort()), sls)
	}
	for i := range headless {
		c.SetService(svcKey{fmt.Sprintf("ns-%d", i), fmt.Sprintf("svc-%d", i)}, build(i, -1))
	}
	for i := range others {
		n := headless + i
		svc := clusterIPService(fmt.Sprintf("ns-%d", n), fmt.Sprintf("svc-%d", n), []string{fmt.Sprintf("10.96.%d.%d", n>>8, n&255)}, httpPort())
		c.SetService(svcKey{svc.Namespace, svc.Name}, buildService(svc, nil))
	}
	ix = c.Done(1)
	size := float64(liveHeap()-before) / 1e6
	k := svcKey{"ns-7", "svc-7"}
	states := [2]*service{build(7, 42), build(7, -1)}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		c := ix.Edit()
		if !c.SetService(k, states[i%2]) {
			b.Fatal("no change")
		}
		ix = c.Done(ix.serial + 1)
	}
	b.ReportMetric(size, "index-MB")
}
