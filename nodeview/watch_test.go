package nodeview

import (
	"context"
	"slices"
	"testing"

	"github.com/netplane/netplane/internal/runner"
)

// TestChangedNodesAreKeptOnlyForAFeatureThatAsks: the overlay applies each
// changed Node on its own and asks for their names; the pod network shares
// the view type but never asks, and must not keep a name for every Node
// that ever changed.
func TestChangedNodesAreKeptOnlyForAFeatureThatAsks(t *testing.T) {
	idle := func(context.Context, bool) error { return nil }
	for _, tc := range []struct {
		name  string
		track bool
		want  []string
	}{
		{"tracked: added, updated and deleted Nodes", true, []string{"a", "b", "c"}},
		{"untracked: nothing kept", false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := &Nodes{loop: &Loop{runner: runner.New(idle, runner.Options{})}}
			if tc.track {
				n.TrackChanges()
			}
			n.change(nil, &Node{Name: "a"})
			n.change(&Node{Name: "b"}, &Node{Name: "b"})
			n.change(&Node{Name: "c"}, nil)
			if len(n.changed) != len(tc.want) {
				t.Errorf("kept %v, want %v", n.changed, tc.want)
			}
			got := n.Changed()
			slices.Sort(got)
			if !slices.Equal(got, tc.want) && !(len(got) == 0 && len(tc.want) == 0) {
				t.Errorf("Changed() = %v, want %v", got, tc.want)
			}
			if again := n.Changed(); len(again) != 0 {
				t.Errorf("Changed() again = %v, want nothing: a call takes the names", again)
			}
		})
	}
}
