package podnet

import (
	"slices"
	"testing"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/internal/role"
	"github.com/netplane/netplane/nft"
	"github.com/netplane/netplane/nodeview"
)

// The masquerade table is programmed through the driver, here its fake:
// each sync sends only what changed, and a full sync repairs what someone
// else deleted. Each step runs on the state the steps before it left.
func TestMasqueradeTableSyncsThroughTheDriver(t *testing.T) {
	self := nodeview.Node{Name: "self", PodCIDRs: prefixes("10.244.0.0/24")}
	other := nodeview.Node{Name: "o", PodCIDRs: prefixes("10.244.1.0/24")}
	whole := []string{"add table", "add chain postrouting", "add chain forward", "rewrite postrouting", "rewrite forward"}
	fake := nft.NewFake(MasqTable)
	f := &Feature{d: role.Deps{Config: &v1alpha1.Configuration{}}, masq: fake}
	for _, tc := range []struct {
		name    string
		nodes   []nodeview.Node
		full    bool
		deleted bool // someone deletes the table before the sync
		steps   []string
		absent  bool // the table is not there after the sync
	}{
		{"the first sync writes the table", []nodeview.Node{self}, true, false, whole, false},
		{"nothing changed: nothing sent", []nodeview.Node{self}, false, false, nil, false},
		{"another node's pod CIDR is exempted", []nodeview.Node{self, other}, false, false, []string{"rewrite postrouting", "rewrite forward"}, false},
		{"a partial sync does not look at a deleted table", []nodeview.Node{self, other}, false, true, nil, true},
		{"a full sync repairs it", []nodeview.Node{self, other}, true, false, whole, false},
	} {
		if tc.deleted {
			fake.Edit(func(*nft.Table) *nft.Table { return nil })
		}
		if err := f.syncMasquerade(self, tc.nodes, tc.full); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		// Chains of one kind go in no set order.
		got := fake.Steps()
		slices.Sort(got)
		slices.Sort(tc.steps)
		if !slices.Equal(got, tc.steps) {
			t.Errorf("%s: steps %q, want %q", tc.name, got, tc.steps)
		}
		want := masqueradeTable(masqPlan{Sources: self.PodCIDRs, Exempt: f.settings.ClusterCIDRs(tc.nodes)}).Dump()
		if tc.absent {
			want = ""
		}
		if got := fake.Dump(); got != want {
			t.Errorf("%s: the table is\n%s\nwant\n%s", tc.name, got, want)
		}
	}
}
