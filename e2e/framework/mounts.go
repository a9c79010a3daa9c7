package framework

import (
	"bufio"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// UnmountUnder lazily unmounts every mount below dir, deepest first: what a
// container runtime started by a test (sandbox root filesystems, shm, netns
// bind mounts) may leave behind after a failure. It returns the mounts it
// could not remove.
func UnmountUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var mounts []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && strings.HasPrefix(fields[4], strings.TrimSuffix(dir, "/")+"/") {
			mounts = append(mounts, fields[4])
		}
	}
	var failed []string
	for i := len(mounts) - 1; i >= 0; i-- {
		if err := unix.Unmount(mounts[i], unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
			failed = append(failed, mounts[i]+": "+err.Error())
		}
	}
	return failed
}
