package framework

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// CPUTime is the user and system CPU time process pid has used so far,
// from /proc/PID/stat; 0 if it cannot be read (the process is gone).
func CPUTime(pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command's closing parenthesis (which may hold
	// spaces) start with the state; utime and stime are the 12th and 13th
	// of them, in clock ticks of 1/100 s.
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.Atoi(f[11])
	s, _ := strconv.Atoi(f[12])
	return time.Duration(u+s) * 10 * time.Millisecond
}
