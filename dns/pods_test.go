package dns

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// testPod is a pod in a namespace of its own name, which its moves carry.
func testPod(name string, phase corev1.PodPhase, ips ...string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: name, Name: name}, Status: corev1.PodStatus{Phase: phase}}
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	return p
}

// moveText is a move as "namespace: old -> cur".
func moveText(m podMove) string {
	return fmt.Sprintf("%s: %v -> %v", m.ns, m.old, m.cur)
}

func TestPodSinkHandsOnWhatEachPodGaveBackAndTook(t *testing.T) {
	a := testPod("a", corev1.PodRunning, "10.0.0.1")
	b := testPod("b", corev1.PodRunning, "10.0.0.2", "fd00::2")
	for _, tc := range []struct {
		name  string
		calls func(s *podSink)
		want  []string
	}{
		{"a pod taking addresses moves onto them", func(s *podSink) { s.Add(b) },
			[]string{"b: [] -> [10.0.0.2 fd00::2]"}},
		{"a pod without an address yet is no move", func(s *podSink) { s.Add(testPod("a", corev1.PodPending)) },
			nil},
		{"an update that keeps the addresses is no move", func(s *podSink) { s.Add(a); s.Update(a) },
			[]string{"a: [] -> [10.0.0.1]"}},
		{"a finished pod gives its address back", func(s *podSink) { s.Add(a); s.Update(testPod("a", corev1.PodSucceeded, "10.0.0.1")) },
			[]string{"a: [] -> [10.0.0.1]", "a: [10.0.0.1] -> []"}},
		{"a deleted pod gives its address back", func(s *podSink) { s.Add(a); s.Delete(a) },
			[]string{"a: [] -> [10.0.0.1]", "a: [10.0.0.1] -> []"}},
		{"a pod whose deletion was missed gives its address back", func(s *podSink) {
			s.Add(a)
			s.Delete(cache.DeletedFinalStateUnknown{Key: "a/a", Obj: a})
		}, []string{"a: [] -> [10.0.0.1]", "a: [10.0.0.1] -> []"}},
		{"a relist moves only the pods that differ", func(s *podSink) {
			s.Add(a)
			s.Replace([]any{a, b}, "")
		}, []string{"a: [] -> [10.0.0.1]", "b: [] -> [10.0.0.2 fd00::2]"}},
		{"a streamed list hands on its moves together when it ends", func(s *podSink) {
			s.BeginList()
			s.Add(a)
			s.Add(b)
			s.EndList("")
		}, []string{"a: [] -> [10.0.0.1] + b: [] -> [10.0.0.2 fd00::2]"}},
		{"a streamed list gives back the addresses of pods it did not name", func(s *podSink) {
			s.Add(a)
			s.Add(b)
			s.BeginList()
			s.Add(b)
			s.EndList("")
		}, []string{"a: [] -> [10.0.0.1]", "b: [] -> [10.0.0.2 fd00::2]", "a: [10.0.0.1] -> []"}},
		{"a pod deleted while it is listed gives its addresses back with the list", func(s *podSink) {
			s.BeginList()
			s.Add(a)
			s.Delete(a)
			s.EndList("")
		}, []string{"a: [] -> [10.0.0.1] + a: [10.0.0.1] -> []"}},
		{"a list cut short hands its moves on with the next, which alone says what is gone", func(s *podSink) {
			s.Add(a)
			s.BeginList()
			s.Add(b)
			s.BeginList()
			s.Add(b)
			s.EndList("")
		}, []string{"a: [] -> [10.0.0.1]", "b: [] -> [10.0.0.2 fd00::2] + a: [10.0.0.1] -> []"}},
		{"a change after a list ends is handed on at once", func(s *podSink) {
			s.BeginList()
			s.Add(a)
			s.EndList("")
			s.Update(testPod("a", corev1.PodRunning, "10.0.0.9"))
		}, []string{"a: [] -> [10.0.0.1]", "a: [10.0.0.1] -> [10.0.0.9]"}},
		{"a relist gives back the addresses of pods no longer listed", func(s *podSink) {
			s.Add(a)
			s.Replace(nil, "")
		}, []string{"a: [] -> [10.0.0.1]", "a: [10.0.0.1] -> []"}},
		{"a pod listing more addresses than the API server allows is kept to two, and gives back the same two", func(s *podSink) {
			c := testPod("c", corev1.PodRunning, "10.0.0.3", "fd00::3", "10.0.0.33")
			s.Add(c)
			s.Delete(c)
		}, []string{"c: [] -> [10.0.0.3 fd00::3]", "c: [10.0.0.3 fd00::3] -> []"}},
		{"each relist gives back the addresses of the pods it no longer lists", func(s *podSink) {
			s.Replace([]any{a, b}, "")
			s.Replace([]any{b}, "")
			s.Replace([]any{a}, "")
		}, []string{"a: [] -> [10.0.0.1] + b: [] -> [10.0.0.2 fd00::2]", "a: [10.0.0.1] -> []",
			"a: [] -> [10.0.0.1] + b: [10.0.0.2 fd00::2] -> []"}},
		{"a watch-list relists what the transformer kept", func(s *podSink) {
			kept := podRecord(b)
			s.Replace([]any{kept}, "")
		}, []string{"b: [] -> [10.0.0.2 fd00::2]"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string // one line a hand-over, its moves joined by " + "
			s := newPodSink(func(ms []podMove) {
				var batch []string
				for _, m := range ms {
					batch = append(batch, moveText(m))
				}
				if len(batch) > 0 {
					got = append(got, strings.Join(batch, " + "))
				}
			})
			tc.calls(s)
			if !slices.Equal(got, tc.want) {
				t.Errorf("moves:\n got: %s\nwant: %s", strings.Join(got, "; "), strings.Join(tc.want, "; "))
			}
		})
	}
}

// TestPodMovesKeepEveryPodOfASharedAddress: host-network pods share their
// node's address; one leaving must not take the address from the others,
// even from another pod of its own namespace.
func TestPodMovesKeepEveryPodOfASharedAddress(t *testing.T) {
	for _, addr := range []string{"192.0.2.1", "2001:db8::1", "::ffff:192.0.2.1"} {
		t.Run(addr, func(t *testing.T) {
			ip := netip.MustParseAddr(addr)
			on := []netip.Addr{ip}
			c := NewIndex().Edit()
			c.SetPod("kube-system", nil, on)
			c.SetPod("monitoring", nil, on)
			c.SetPod("monitoring", nil, on)
			c.SetPod("kube-system", on, nil)
			c.SetPod("monitoring", on, nil)
			ix := c.Done(1)
			if ns, ok := ix.podNamespace(ip.Unmap()); !ok || ns != "monitoring" {
				t.Errorf("namespace of the shared address: %q, %v; want monitoring", ns, ok)
			}
			if !ix.podIn(ip, "monitoring") {
				t.Error("the pod that stayed lost the address")
			}
			if ix.podIn(ip, "kube-system") {
				t.Error("the pod that left still holds the address")
			}
			c = ix.Edit()
			c.SetPod("monitoring", on, nil)
			if _, ok := c.Done(2).podNamespace(ip); ok {
				t.Error("the address is still a pod's after the last one left")
			}
		})
	}
}

func TestPodSinkIsToldOfEachChunkOfAList(t *testing.T) {
	for _, tc := range []struct {
		name   string
		listed bool // the pods come in a list, not as watch events
		pods   int
		chunks int
	}{
		{"an empty list is one chunk, as it opens", true, 0, 1},
		{"a list of less than a chunk", true, listChunk - 1, 1},
		{"a list of one chunk", true, listChunk, 2},
		{"a list of two and a half chunks", true, 5 * listChunk / 2, 3},
		{"watch events are no list", false, 2 * listChunk, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newPodSink(func([]podMove) {})
			chunks := 0
			s.chunk = func() { chunks++ }
			if tc.listed {
				s.BeginList()
			}
			for i := range tc.pods {
				s.Add(testPod(fmt.Sprintf("p-%d", i), corev1.PodRunning, fmt.Sprintf("10.0.%d.%d", i>>8, i&255)))
			}
			if tc.listed {
				s.EndList("")
			}
			if chunks != tc.chunks {
				t.Errorf("told of %d chunks for %d pods, want %d", chunks, tc.pods, tc.chunks)
			}
		})
	}
}

// TestPodSinkIsToldOfRelistsOnly: the first list is the start-up sync; a
// list after one has ended is a relist, whether it comes streamed or whole.
func TestPodSinkIsToldOfRelistsOnly(t *testing.T) {
	pod := testPod("p", corev1.PodRunning, "10.0.0.1")
	for _, tc := range []struct {
		name    string
		lists   []string // "stream" (BeginList, Add, EndList), "whole" (Replace), "open" (BeginList only)
		relists int
	}{
		{"the first list", []string{"stream"}, 0},
		{"a list after it", []string{"stream", "stream"}, 1},
		{"whole lists", []string{"whole", "whole", "whole"}, 2},
		{"a list that never ended", []string{"open", "stream"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newPodSink(func([]podMove) {})
			relists := 0
			s.relist = func() { relists++ }
			for _, l := range tc.lists {
				switch l {
				case "whole":
					_ = s.Replace([]any{pod}, "")
				case "open":
					s.BeginList()
				default:
					s.BeginList()
					_ = s.Add(pod)
					_ = s.EndList("")
				}
			}
			if relists != tc.relists {
				t.Errorf("told of %d relists, want %d", relists, tc.relists)
			}
		})
	}
}
