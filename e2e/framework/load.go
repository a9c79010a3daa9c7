package framework

import (
	"os"
	"strings"
)

// LoadAverage is the machine's 1, 5 and 15 minute load averages, which the
// benchmarks print beside every figure: on a shared machine they say how
// far to trust it.
func LoadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}
