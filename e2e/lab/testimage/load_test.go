package main

import (
	"os"
	"path/filepath"
	"testing"
)

// TestALoadSaysWhatStoppedIt: the upgrade scenario takes a load that
// stopped by its stop file as one that ran across the disruption.
func TestALoadSaysWhatStoppedIt(t *testing.T) {
	for _, c := range []struct {
		name string
		stop bool
		max  string
		want string
	}{
		{"the stop file", true, "1m", "stop-file"},
		{"--max", false, "200ms", "max"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			stop := filepath.Join(dir, "stop")
			if c.stop {
				if err := os.WriteFile(stop, nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			r, err := runLoad([]string{"--stop-file=" + stop, "--started-file=" + filepath.Join(dir, "started"), "--max=" + c.max})
			if err != nil {
				t.Fatal(err)
			}
			if r.Stopped != c.want {
				t.Errorf("stopped by %q, want %q", r.Stopped, c.want)
			}
		})
	}
}
