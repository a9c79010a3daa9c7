package plugin_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/netplane/netplane/e2e/netns"
)

// TestDelLeavesNothingWhetherTheRuntimeKeepsTheNetnsOrDeletesIt: DEL returns
// before the kernel has freed the pair (a helper process waits for that), so
// everything a runtime or another pod could see must already be gone when it
// returns: both veth ends, the pod's addresses, the bridge port and the IPAM
// record, in a netns the runtime keeps as in one it deletes at once. The
// helper must then end on its own.
func TestDelLeavesNothingWhetherTheRuntimeKeepsTheNetnsOrDeletesIt(t *testing.T) {
	for _, tc := range []struct {
		name        string
		deleteNetns bool
	}{
		{"netns kept", false},
		{"netns deleted right after DEL", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t, nodeOpts{podCIDRs: []string{"10.244.1.0/24", "fd00:10:244:1::/64"}})
			node := handle(t, n.ns)
			kept := netns.New(t, "pod")
			// Several attachments: a DEL that returned before the
			// removal would lose the race to these checks now and then,
			// not every time.
			for i := range 8 {
				pod := kept
				if tc.deleteNetns {
					pod = netns.New(t, "pod")
				}
				inPod := handle(t, pod)
				r := rt(pod, fmt.Sprintf("del-%d", i))
				res := n.mustAdd(t, r)
				n.mustDel(t, r)
				// Netlink first: it answers within microseconds of
				// DEL's return.
				if links, err := node.LinkList(); err != nil || slices.ContainsFunc(links, isVeth) {
					t.Fatalf("attachment %d: a veth on the node when DEL returned (%v)", i, err)
				}
				if links, err := inPod.LinkList(); err != nil || slices.ContainsFunc(links, isVeth) {
					t.Fatalf("attachment %d: a veth in the pod's netns when DEL returned (%v)", i, err)
				}
				if tc.deleteNetns {
					if err := pod.Delete(); err != nil {
						t.Fatal(err)
					}
				} else {
					out := pod.MustExec(t, "ip", "-o", "addr", "show")
					for _, a := range []string{addrOf(t, res, false).String(), addrOf(t, res, true).String(), "eth0"} {
						if strings.Contains(out, a) {
							t.Fatalf("attachment %d: the kept netns still shows %s after DEL:\n%s", i, a, out)
						}
					}
				}
				if ports := n.bridgePorts(t); len(ports) != 0 {
					t.Fatalf("attachment %d: bridge ports after DEL: %v", i, ports)
				}
				if st := n.state(t); len(st.Attachments) != 0 {
					t.Fatalf("attachment %d: IPAM records after DEL: %+v", i, st.Attachments)
				}
			}
			requireNoHelperWithin(t, 10*time.Second)
		})
	}
}

func isVeth(l netlink.Link) bool { return l.Type() == "veth" }

// requireNoHelperWithin fails if a delete-link helper of the plugin under
// test is still running after d.
func requireNoHelperWithin(t *testing.T, d time.Duration) {
	t.Helper()
	bin, err := filepath.EvalSymlinks(filepath.Join(pluginDir(t), "netplane-cni"))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(d)
	for {
		pids := helpers(bin)
		if len(pids) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("delete-link helpers %v still running %v after DEL", pids, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// helpers lists the processes running bin's delete-link command.
func helpers(bin string) []string {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	var out []string
	for _, d := range dirs {
		if exe, err := os.Readlink(d + "/exe"); err != nil || exe != bin {
			continue
		}
		cmdline, _ := os.ReadFile(d + "/cmdline")
		if bytes.Contains(cmdline, []byte("\x00delete-link\x00")) {
			out = append(out, filepath.Base(d))
		}
	}
	return out
}
