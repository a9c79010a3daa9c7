package policy

import (
	"testing"
	"time"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
	"github.com/netplane/netplane/nft"
)

// BenchmarkFullSyncAtScale is a first sync at the scale of the enforcer's
// bounds (bench_test.go), 1,000 policies × 10,000 pods, both families: the model built from the
// records, rendered onto the driver's table and programmed whole, on the
// driver's fake kernel and on a real one (a fresh network namespace each
// time). It reports each phase; ns/op is the whole.
func BenchmarkFullSyncAtScale(b *testing.B) {
	for _, unshared := range []bool{false, true} {
		s := newScale(b, 100, 100, 10, 100, unshared)
		name := map[bool]string{false: "shared", true: "unshared"}[unshared]
		b.Run(name+"/fake", func(b *testing.B) {
			fullSyncs(b, s, func() nft.Syncer { return nft.NewFake(TableID) })
		})
		b.Run(name+"/kernel", func(b *testing.B) {
			framework.RequireRoot(b)
			fullSyncs(b, s, func() nft.Syncer {
				b.StopTimer()
				defer b.StartTimer()
				ns := netns.New(b, "polbench")
				d, closeNS, err := nft.NamespaceDialer(ns.Path)
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { closeNS() })
				return nft.NewProgrammer(d, TableID)
			})
		})
	}
}

func fullSyncs(b *testing.B, s *scale, kernel func() nft.Syncer) {
	var build, render, program time.Duration
	var t *nft.Table
	for b.Loop() {
		k := kernel()
		start := time.Now()
		m := NewModel(Config{Node: "n0"})
		s.addTo(m)
		built := time.Now()
		t = newRenderer(m.Table()).full()
		rendered := time.Now()
		if _, err := k.Sync(t, true); err != nil {
			b.Fatal(err)
		}
		build, render, program = build+built.Sub(start), render+rendered.Sub(built), program+time.Since(rendered)
		b.StopTimer()
		k.Close()
		b.StartTimer()
	}
	n := float64(b.N)
	b.ReportMetric(float64(build.Milliseconds())/n, "build-ms")
	b.ReportMetric(float64(render.Milliseconds())/n, "render-ms")
	b.ReportMetric(float64(program.Milliseconds())/n, "program-ms")
	elems := 0
	for _, set := range t.Sets {
		elems += set.Len()
	}
	b.ReportMetric(float64(len(t.Chains)), "chains")
	b.ReportMetric(float64(len(t.Sets)), "sets")
	b.ReportMetric(float64(elems), "elements")
}

// BenchmarkPartialSyncAtScale is the sync of one change at the same
// scale after a full sync: what the model touched, rendered and sent.
// Each change is undone by the next iteration, also timed. (The fake
// copies its whole table for each transaction, all or nothing, so only
// the kernel's times follow the change.)
func BenchmarkPartialSyncAtScale(b *testing.B) {
	s := newScale(b, 100, 100, 10, 100, false)
	pol := newSelectorPolicy(b)
	local := *s.pods[0]
	local.Labels = map[string]string{"app": "app-3", "tier": "db", "pod-template-hash": "h0"}
	created := scalePod("ns-5", 1000, 20000, 100)
	created.Node = "n0"
	changes := []struct {
		name     string
		do, undo func(m *Model)
	}{
		{"local pod relabelled", func(m *Model) { m.UpsertPod(&local) }, func(m *Model) { m.UpsertPod(s.pods[0]) }},
		{"local pod created", func(m *Model) { m.UpsertPod(created) }, func(m *Model) { m.DeletePod(created.Key()) }},
		{"policy created", func(m *Model) { m.UpsertPolicy(pol) }, func(m *Model) { m.DeletePolicy(pol.Key()) }},
	}
	for _, kind := range []string{"fake", "kernel"} {
		for _, ch := range changes {
			b.Run(kind+"/"+ch.name, func(b *testing.B) {
				var k nft.Syncer = nft.NewFake(TableID)
				if kind == "kernel" {
					framework.RequireRoot(b)
					d, closeNS, err := nft.NamespaceDialer(netns.New(b, "polbench").Path)
					if err != nil {
						b.Fatal(err)
					}
					b.Cleanup(func() { closeNS() })
					k = nft.NewProgrammer(d, TableID)
				}
				defer k.Close()
				m := NewModel(Config{Node: "n0"})
				s.addTo(m)
				m.TakeTouched()
				r := newRenderer(m.Table())
				if _, err := k.Sync(r.full(), true); err != nil {
					b.Fatal(err)
				}
				changeLoop(b, k, m, r, ch.do, ch.undo)
			})
		}
	}
}
