package plugin_test

import (
	"strings"
	"testing"

	"github.com/netplane/netplane/e2e/netns"
)

// TestAddOnADeviceThatIsNotABridgeSaysSoAndKeepsNothing: ADD reads the bridge
// with ioctls, which cannot tell a bridge from another device; the kernel's
// refusal to enslave the veth must still come back as a plain answer.
func TestAddOnADeviceThatIsNotABridgeSaysSoAndKeepsNothing(t *testing.T) {
	n := newNode(t, nodeOpts{})
	n.ns.MustExec(t, "ip", "link", "add", "cni0", "type", "veth", "peer", "name", "cni0-peer")
	n.ns.MustExec(t, "ip", "link", "set", "cni0", "up")
	_, err := n.add(rt(netns.New(t, "pod"), "not-a-bridge"))
	if err == nil || !strings.Contains(err.Error(), "is a veth, not a bridge") {
		t.Fatalf("ADD on a veth named cni0: got %v, want an error saying it is not a bridge", err)
	}
	if st := n.state(t); len(st.Attachments) != 0 {
		t.Errorf("IPAM records after the failed ADD: %+v", st.Attachments)
	}
	if v := n.veths(t); len(v) != 0 {
		t.Errorf("host veths after the failed ADD: %v", v)
	}
}
