package lab

import (
	"os"
	"path/filepath"
	"testing"
)

// TestMountPointsAreTheMachinesAgainWhenTheLastLabGoes: the nodes' mount
// points the machine lacked are made for the first lab and removed,
// deepest first, when the last lab goes; folders the machine had, and a
// made folder someone else has since put a file in, stay.
func TestMountPointsAreTheMachinesAgainWhenTheLastLabGoes(t *testing.T) {
	root := t.TempDir()
	oldRecord, oldPaths, oldSysctls := machineRecord, nodePaths, kubeletSysctls
	t.Cleanup(func() { machineRecord, nodePaths, kubeletSysctls = oldRecord, oldPaths, oldSysctls })
	// Kernel-wide settings are no test's to write.
	kubeletSysctls = nil
	machineRecord = filepath.Join(root, "record")
	had := filepath.Join(root, "etc")
	if err := os.MkdirAll(filepath.Join(had, "kept"), 0o755); err != nil {
		t.Fatal(err)
	}
	nodePaths = []string{
		filepath.Join(had, "cni", "net.d"),
		filepath.Join(root, "var", "lib", "kubelet"),
		filepath.Join(root, "var", "lib", "netplane"),
		filepath.Join(root, "run", "containerd"),
	}
	labA, labB := filepath.Join(root, "a"), filepath.Join(root, "b")
	for _, lab := range []string{labA, labB} {
		if err := os.MkdirAll(lab, 0o755); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(lab, stateName), []byte("{}"), 0o644)
		if err := holdMachine(lab); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range nodePaths {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("mount point %s not made: %v", p, err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "run", "containerd", "someone-elses"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := releaseMachine(labA); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(nodePaths[1]); err != nil {
		t.Fatalf("lab b still runs, but %s is gone: %v", nodePaths[1], err)
	}
	os.Remove(filepath.Join(labB, stateName))
	if err := releaseMachine(labB); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path string
		want bool
	}{
		{filepath.Join(had, "kept"), true},
		{had, true},
		{filepath.Join(had, "cni"), false},
		{filepath.Join(root, "var"), false},
		{filepath.Join(root, "run", "containerd"), true},
		{filepath.Join(root, "run"), true},
		{machineRecord, false},
	} {
		_, err := os.Stat(c.path)
		if got := err == nil; got != c.want {
			t.Errorf("%s exists: %v, want %v", c.path, got, c.want)
		}
	}
}
