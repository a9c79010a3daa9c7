package proxy

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"

	"github.com/netplane/netplane/nodeview"
)

// TestIncrementalModelEqualsAFreshBuild changes Services and slices at
// random and checks, after every step, that the cached model's tables are
// exactly what a fresh build gives.
// The model kept by Apply, told only the Services each step changed (as a
// partial sync is), must equal it too.
func TestIncrementalModelEqualsAFreshBuild(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	in := overall()
	m, ma := NewModel(), NewModel()
	ma.Build(in)
	keys := func() []types.NamespacedName {
		var ks []types.NamespacedName
		for _, s := range in.Services {
			ks = append(ks, s.key())
		}
		return ks
	}
	var deleted []*serviceRecord
	for step := 0; step < 300; step++ {
		ks := keys()
		k := ks[rng.IntN(len(ks))]
		changed := []types.NamespacedName{k}
		switch rng.IntN(4) {
		case 0: // move an endpoint to a shared address
			if ss := in.Slices[k]; len(ss) > 0 {
				s := *ss[0]
				s.endpoints = slices.Clone(s.endpoints)
				if len(s.endpoints) > 0 {
					s.endpoints[rng.IntN(len(s.endpoints))].addr = netip.MustParseAddr(fmt.Sprintf("10.180.0.%d", 1+rng.IntN(3)))
				}
				in.Slices[k] = append([]*sliceRecord{&s}, ss[1:]...)
			}
		case 1: // drop all slices
			delete(in.Slices, k)
		case 2: // delete a Service, or bring a deleted one back
			if len(deleted) > 0 && (len(in.Services) < 4 || rng.IntN(2) == 0) {
				c := *deleted[0]
				in.Services = append(slices.Clone(in.Services), &c)
				deleted = deleted[1:]
				changed = []types.NamespacedName{c.key()}
				break
			}
			for i, s := range in.Services {
				if s.key() == k {
					in.Services = slices.Delete(slices.Clone(in.Services), i, i+1)
					deleted = append(deleted, s)
					break
				}
			}
		case 3: // a new pointer with the same content
			for i, s := range in.Services {
				if s.key() == k {
					c := *s
					in.Services = slices.Clone(in.Services)
					in.Services[i] = &c
				}
			}
		}
		got := m.Build(in)
		want := Build(in)
		delta := map[types.NamespacedName]Change{}
		for _, name := range changed {
			c := Change{Slices: in.Slices[name]}
			for _, s := range in.Services {
				if s.key() == name {
					c.Svc = s
				}
			}
			delta[name] = c
		}
		applied := ma.Apply(delta)
		for _, fam := range []nodeview.Family{nodeview.IPv4, nodeview.IPv6} {
			if diff := cmp.Diff(want.Tables[fam].Dump(), got.Tables[fam].Dump()); diff != "" {
				t.Fatalf("step %d: incremental model differs from a fresh build (-fresh +incremental):\n%s", step, diff)
			}
			if diff := cmp.Diff(want.Tables[fam].Dump(), applied.Tables[fam].Dump()); diff != "" {
				t.Fatalf("step %d: model told the changes differs from a fresh build (-fresh +applied):\n%s", step, diff)
			}
		}
		if diff := cmp.Diff(want.Health, applied.Health); diff != "" {
			t.Fatalf("step %d: health-check summaries differ (-fresh +applied):\n%s", step, diff)
		}
	}
}

// TestParallelBuildEqualsASequentialOne: at start-up fragments are built on
// all CPUs; the merged tables must not depend on it.
func TestParallelBuildEqualsASequentialOne(t *testing.T) {
	in := scaleInput(1200)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4)) // parallel on any machine
	parallel := Build(in)
	defer func(n int) { parallelFrom = n }(parallelFrom)
	parallelFrom = 1 << 30
	sequential := Build(in)
	for _, fam := range nodeview.Families {
		if diff := cmp.Diff(sequential.Tables[fam].Dump(), parallel.Tables[fam].Dump()); diff != "" {
			t.Fatalf("parallel build differs (-sequential +parallel):\n%s", diff)
		}
	}
}
