package dns

import (
	"fmt"
	"net/netip"
	"testing"
)

func addrsOf(ips ...string) packedAddrs {
	var as []netip.Addr
	for _, ip := range ips {
		as = append(as, netip.MustParseAddr(ip))
	}
	return pack(as)
}

// TestPodStoreKeepsEachPodOnce: a pod changing families moves between the
// store's two maps and is never in both; a pod of a namespace numbered
// past what a small slot holds is kept in a large one.
func TestPodStoreKeepsEachPodOnce(t *testing.T) {
	for _, tc := range []struct {
		name  string
		puts  [][]string // the pod's addresses, put in turn
		small int        // pods in the 16-byte slots after the puts
	}{
		{"one IPv4 address", [][]string{{"10.0.0.1"}}, 1},
		{"IPv4, then both families", [][]string{{"10.0.0.1"}, {"10.0.0.1", "fd00::1"}}, 0},
		{"both families, then IPv4", [][]string{{"10.0.0.1", "fd00::1"}, {"10.0.0.1"}}, 1},
		{"IPv4, then IPv6", [][]string{{"10.0.0.1"}, {"fd00::1"}}, 0},
		{"IPv4, then none", [][]string{{"10.0.0.1"}, nil}, 0},
		{"IPv4, then another IPv4", [][]string{{"10.0.0.1"}, {"10.0.0.2"}}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newPodStore()
			k := podKey("web", "web-0")
			var last packedAddrs
			for _, ips := range tc.puts {
				last = addrsOf(ips...)
				s.put(k, "web", last)
			}
			ns, got := s.get(k)
			if got != last || (last.n() > 0 && ns != "web") {
				t.Errorf("get: %q %v, want web %v", ns, got.unpack(), last.unpack())
			}
			if want := min(last.n(), 1); s.len() != want || s.v4.len() != tc.small {
				t.Errorf("%d pods, %d in small slots; want %d, %d", s.len(), s.v4.len(), want, tc.small)
			}
		})
	}
	s := newPodStore()
	s.ns4 = 1
	s.put(podKey("a", "p"), "a", addrsOf("10.0.0.1"))
	s.put(podKey("b", "p"), "b", addrsOf("10.0.0.2"))
	if s.v4.len() != 1 || len(s.other) != 1 {
		t.Errorf("namespace numbers 0 and 1 past a limit of 1: %d small, %d large; want 1, 1", s.v4.len(), len(s.other))
	}
	if ns, a := s.get(podKey("b", "p")); ns != "b" || a != addrsOf("10.0.0.2") {
		t.Errorf("the pod in a large slot: %q %v", ns, a.unpack())
	}
}

// TestPodStoreSweepsAfterListsCutShort: a small slot marks its pod with
// one byte of its list's number; however many lists are cut short, the
// next list to end forgets every pod it did not name, and only those.
func TestPodStoreSweepsAfterListsCutShort(t *testing.T) {
	for _, short := range []int{0, 1, 254, 255, 256, 300, 600} {
		t.Run(fmt.Sprintf("%d lists cut short", short), func(t *testing.T) {
			s := newPodStore()
			named, dropped, dual := podKey("a", "named"), podKey("a", "dropped"), podKey("a", "dual")
			s.begin()
			s.put(named, "a", addrsOf("10.0.0.1"))
			s.put(dropped, "a", addrsOf("10.0.0.2"))
			s.put(dual, "a", addrsOf("10.0.0.3", "fd00::3"))
			s.sweep(func(string, packedAddrs) { t.Fatal("the first list forgot a pod it named") })
			for range short {
				s.begin()
				s.put(named, "a", addrsOf("10.0.0.1"))
			}
			s.begin()
			s.put(named, "a", addrsOf("10.0.0.1"))
			s.put(dual, "a", addrsOf("10.0.0.3", "fd00::3"))
			var gone []string
			s.sweep(func(ns string, a packedAddrs) { gone = append(gone, fmt.Sprint(a.unpack())) })
			if len(gone) != 1 || gone[0] != "[10.0.0.2]" || s.len() != 2 {
				t.Errorf("gone %v, %d pods left; want [[10.0.0.2]], 2", gone, s.len())
			}
		})
	}
}
