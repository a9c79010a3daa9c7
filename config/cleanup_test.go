package config

import (
	"testing"

	"github.com/spf13/pflag"
)

func TestCleanupIsAskedByFlagOrEnvironmentAndTheFlagWins(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		env     map[string]string
		want    Cleanup
		wantErr string
	}{
		{name: "neither", want: Cleanup{}},
		{name: "flag", args: []string{"--cleanup"}, want: Cleanup{Run: true}},
		{name: "flag keeping IPAM", args: []string{"--cleanup", "--cleanup-keep-ipam"}, want: Cleanup{Run: true, KeepIPAM: true}},
		{name: "environment", env: map[string]string{"NETPLANE_CLEANUP": "true", "NETPLANE_CLEANUP_KEEP_IPAM": " 1 "}, want: Cleanup{Run: true, KeepIPAM: true}},
		{name: "flag over environment", args: []string{"--cleanup=false"}, env: map[string]string{"NETPLANE_CLEANUP": "true"}, want: Cleanup{}},
		{name: "bad environment", env: map[string]string{"NETPLANE_CLEANUP": "yes"}, wantErr: `NETPLANE_CLEANUP="yes" is neither true nor false`},
		{name: "keeping IPAM alone", args: []string{"--cleanup-keep-ipam"}, wantErr: "--cleanup-keep-ipam applies only with --cleanup"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
			AddFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			got, err := CleanupOf(fs)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}
