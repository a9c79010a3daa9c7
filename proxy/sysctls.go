package proxy

import (
	"strconv"
	"time"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/link"
)

// conntrackSysctls are the net.netfilter sysctls the conntrack settings
// ask for, in seconds; a zero timeout leaves the kernel's.
func conntrackSysctls(c v1alpha1.Conntrack) [][2]string {
	var out [][2]string
	for _, s := range []struct {
		key string
		d   time.Duration
	}{
		{"net/netfilter/nf_conntrack_tcp_timeout_established", c.TCPEstablishedTimeout.Duration},
		{"net/netfilter/nf_conntrack_tcp_timeout_close_wait", c.TCPCloseWaitTimeout.Duration},
	} {
		if s.d > 0 {
			out = append(out, [2]string{s.key, strconv.Itoa(int(s.d.Round(time.Second) / time.Second))})
		}
	}
	return out
}

// setConntrackTimeouts writes them under procSys. It runs after the first
// sync: the table's ct expressions have loaded nf_conntrack by then, and
// its sysctls exist.
func setConntrackTimeouts(procSys string, c v1alpha1.Conntrack) error {
	for _, s := range conntrackSysctls(c) {
		if err := link.SysctlIn(procSys, s[0], s[1]); err != nil {
			return err
		}
	}
	return nil
}
