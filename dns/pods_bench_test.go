package dns

import (
	"fmt"
	"net/netip"
	"runtime"
	"testing"
	"time"
)

// BenchmarkAutopathMemory: the live heap autopath's two tables hold for
// 150,000 pods of one IPv4 address each in 10,000 namespaces, the
// published limit BenchmarkRelistMemory runs at: the pods' view, by pod,
// and the index's table, by address. Reported per pod, with the time a
// relist of the same pods takes the pods' view (no pod moves).
func BenchmarkAutopathMemory(b *testing.B) {
	const pods, namespaces = 150_000, 10_000
	names := make([]string, pods)
	nss := make([]string, namespaces)
	for i := range nss {
		nss[i] = fmt.Sprintf("ns-%d", i)
	}
	for i := range names {
		names[i] = fmt.Sprintf("pod-%d", i)
	}
	for range b.N {
		before := liveHeap()
		ix := NewIndex()
		sink := newPodSink(func(moves []podMove) {
			c := ix.Edit()
			for _, m := range moves {
				c.SetPod(m.ns, m.old, m.cur)
			}
			ix = c.Done(1)
		})
		sink.BeginList()
		for i := range pods {
			a := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
			_ = sink.Add(&podInfo{ns: nss[i%namespaces], name: names[i], addrs: pack([]netip.Addr{a})})
		}
		_ = sink.EndList("1")
		after := liveHeap()
		start := time.Now()
		sink.BeginList()
		for i := range pods {
			a := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
			_ = sink.Add(&podInfo{ns: nss[i%namespaces], name: names[i], addrs: pack([]netip.Addr{a})})
		}
		_ = sink.EndList("2")
		b.ReportMetric(float64(time.Since(start).Nanoseconds())/pods, "relist-ns/pod")
		if ns, ok := ix.podNamespace(netip.AddrFrom4([4]byte{10, 0, 0, 7})); !ok || ns != "ns-7" {
			b.Fatalf("10.0.0.7 is in %q, %v", ns, ok)
		}
		b.ReportMetric(float64(after-before)/pods, "B/pod")
		runtime.KeepAlive(sink)
		runtime.KeepAlive(ix)
	}
}

// liveHeap is the heap's live bytes after a full collection.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkAutopathLookup: the namespace of a client's address, as
// autopath asks it on each query, in the table of 150,000 pods.
func BenchmarkAutopathLookup(b *testing.B) {
	const pods = 150_000
	ix := NewIndex()
	c := ix.Edit()
	addr := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}) }
	for i := range pods {
		c.SetPod(fmt.Sprintf("ns-%d", i%10_000), nil, []netip.Addr{addr(i)})
	}
	ix = c.Done(1)
	b.ResetTimer()
	for i := range b.N {
		if _, ok := ix.podNamespace(addr(i * 7919 % pods)); !ok {
			b.Fatal("no pod")
		}
	}
}
