package framework

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// StatusKiB is a field of /proc/PID/status given in kB, such as VmRSS or
// VmHWM (the peak resident memory); 0 when the process or field is gone.
func StatusKiB(pid int, field string) int {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == field+":" {
			kib, _ := strconv.Atoi(f[1])
			return kib
		}
	}
	return 0
}
