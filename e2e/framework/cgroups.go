package framework

import (
	"os"
	"path/filepath"
	"testing"
)

// RemoveNewCgroups removes, when the test ends, the cgroup folder name in
// every hierarchy under /sys/fs/cgroup that did not exist when it was
// called: a containerd started by a test without a kubelet puts each
// container under /<its namespace>/<id>, removes the container's folder
// but leaves the namespace's. Call it before starting containerd, so the
// cleanup runs after containerd has stopped.
func RemoveNewCgroups(t testing.TB, name string) {
	t.Helper()
	hierarchies, _ := filepath.Glob("/sys/fs/cgroup/*")
	var fresh []string
	for _, h := range hierarchies {
		p := filepath.Join(h, name)
		if _, err := os.Stat(p); os.IsNotExist(err) {
			fresh = append(fresh, p)
		}
	}
	t.Cleanup(func() {
		for _, p := range fresh {
			// Deepest first: a container's folder left by a crash of
			// containerd's shim comes before its namespace's.
			var dirs []string
			filepath.WalkDir(p, func(d string, e os.DirEntry, err error) error {
				if err == nil && e.IsDir() {
					dirs = append(dirs, d)
				}
				return nil
			})
			for i := len(dirs) - 1; i >= 0; i-- {
				if err := os.Remove(dirs[i]); err != nil {
					t.Errorf("cgroup %s left: %v", dirs[i], err)
				}
			}
		}
	})
}
