package wireguard_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/wireguard"
)

// TestPublishPatchChangesOnlyTheAnnotation applies PublishPatch to a Node
// of a real API server, twice with the same key and once with a new one:
// the Node read back differs from the one before in the annotation alone
// (and the server's bookkeeping), and a current key needs no write.
func TestPublishPatchChangesOnlyTheAnnotation(t *testing.T) {
	s := framework.StartAPIServer(t, framework.Options{})
	ctx := framework.Ctx(t)
	nodes := s.Client.CoreV1().Nodes()
	created, err := nodes.Create(ctx, &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "node1", Labels: map[string]string{"zone": "a"},
			Annotations: map[string]string{"node.alpha.kubernetes.io/ttl": "0", "other.example/key": "kept"}},
		Spec: v1.NodeSpec{PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.0/24"}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	created.Status.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "192.168.1.2"}}
	if created, err = nodes.UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	before := created
	for i := range 2 { // the first key, then a rotated one
		priv, _ := wgtypes.GeneratePrivateKey()
		pub := priv.PublicKey()
		patch := wireguard.PublishPatch(before.Annotations, pub)
		if patch == nil {
			t.Fatalf("round %d: no patch for a new key", i)
		}
		after, err := nodes.Patch(ctx, "node1", types.MergePatchType, patch, metav1.PatchOptions{})
		if err != nil {
			t.Fatalf("round %d: patch %s: %v", i, patch, err)
		}
		if got := after.Annotations[wireguard.Annotation]; got != pub.String() {
			t.Errorf("round %d: annotation %q, want %q", i, got, pub)
		}
		if again := wireguard.PublishPatch(after.Annotations, pub); again != nil {
			t.Errorf("round %d: a current key asks for another write: %s", i, again)
		}
		want := before.DeepCopy()
		if want.Annotations == nil {
			want.Annotations = map[string]string{}
		}
		want.Annotations[wireguard.Annotation] = pub.String()
		ignore := func(n *v1.Node) *v1.Node {
			n = n.DeepCopy()
			n.ResourceVersion, n.ManagedFields = "", nil
			return n
		}
		if diff := cmp.Diff(ignore(want), ignore(after)); diff != "" {
			t.Errorf("round %d: the Node changed beyond the annotation (-want +got):\n%s", i, diff)
		}
		before = after
	}
}
