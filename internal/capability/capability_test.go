package capability

import (
	"testing"

	"golang.org/x/sys/unix"
)

func TestRaiseMakesThePermittedEffective(t *testing.T) {
	const bind = 1 << unix.CAP_NET_BIND_SERVICE
	cases := []struct {
		name        string
		in, want    [2]unix.CapUserData
		wantChanged bool
	}{
		{"a file capability, permitted only", [2]unix.CapUserData{{Permitted: bind}}, [2]unix.CapUserData{{Permitted: bind, Effective: bind}}, true},
		{"nothing granted", [2]unix.CapUserData{}, [2]unix.CapUserData{}, false},
		{"root", [2]unix.CapUserData{{Permitted: ^uint32(0), Effective: ^uint32(0)}, {Permitted: 0x1ff, Effective: 0x1ff}},
			[2]unix.CapUserData{{Permitted: ^uint32(0), Effective: ^uint32(0)}, {Permitted: 0x1ff, Effective: 0x1ff}}, false},
		{"an upper capability", [2]unix.CapUserData{{}, {Permitted: 1}}, [2]unix.CapUserData{{}, {Permitted: 1, Effective: 1}}, true},
	}
	for _, c := range cases {
		got := c.in
		if changed := Raise(&got); changed != c.wantChanged || got != c.want {
			t.Errorf("%s: Raise(%+v) = %+v, %v; want %+v, %v", c.name, c.in, got, changed, c.want, c.wantChanged)
		}
	}
}
