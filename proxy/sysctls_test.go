package proxy

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netplane/netplane/apis/config/v1alpha1"
)

func TestConntrackSysctls(t *testing.T) {
	d := func(x time.Duration) metav1.Duration { return metav1.Duration{Duration: x} }
	for _, tc := range []struct {
		name string
		in   v1alpha1.Conntrack
		want [][2]string
	}{
		{"kube-proxy's defaults", v1alpha1.Conntrack{TCPEstablishedTimeout: d(24 * time.Hour), TCPCloseWaitTimeout: d(time.Hour)},
			[][2]string{{"net/netfilter/nf_conntrack_tcp_timeout_established", "86400"}, {"net/netfilter/nf_conntrack_tcp_timeout_close_wait", "3600"}}},
		{"zero leaves the kernel's", v1alpha1.Conntrack{TCPCloseWaitTimeout: d(90 * time.Second)},
			[][2]string{{"net/netfilter/nf_conntrack_tcp_timeout_close_wait", "90"}}},
		{"rounded to seconds", v1alpha1.Conntrack{TCPEstablishedTimeout: d(1500 * time.Millisecond)},
			[][2]string{{"net/netfilter/nf_conntrack_tcp_timeout_established", "2"}}},
		{"none", v1alpha1.Conntrack{}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := conntrackSysctls(tc.in); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// The values land in the files under the configured /proc/sys, where a
// DaemonSet pod has the host's mounted.
func TestSetConntrackTimeoutsWritesUnderProcSys(t *testing.T) {
	dir := t.TempDir()
	nf := filepath.Join(dir, "net", "netfilter")
	if err := os.MkdirAll(nf, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"nf_conntrack_tcp_timeout_established", "nf_conntrack_tcp_timeout_close_wait"} {
		if err := os.WriteFile(filepath.Join(nf, f), []byte("60\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	c := v1alpha1.Conntrack{TCPEstablishedTimeout: metav1.Duration{Duration: 24 * time.Hour}, TCPCloseWaitTimeout: metav1.Duration{Duration: time.Hour}}
	if err := setConntrackTimeouts(dir, c); err != nil {
		t.Fatal(err)
	}
	for f, want := range map[string]string{"nf_conntrack_tcp_timeout_established": "86400", "nf_conntrack_tcp_timeout_close_wait": "3600"} {
		if got, _ := os.ReadFile(filepath.Join(nf, f)); string(got) != want {
			t.Errorf("%s = %q, want %q", f, got, want)
		}
	}
	if err := setConntrackTimeouts(t.TempDir(), c); err == nil {
		t.Error("no error for a /proc/sys without nf_conntrack's sysctls")
	}
}
