package framework

import (
	"os"
	"testing"
	"time"
)

// TestCPUTimeCountsThisProcess burns 200 ms of CPU and reads it back.
func TestCPUTimeCountsThisProcess(t *testing.T) {
	before := CPUTime(os.Getpid())
	for start := time.Now(); time.Since(start) < 200*time.Millisecond; {
	}
	if got := CPUTime(os.Getpid()) - before; got < 100*time.Millisecond {
		t.Errorf("200 ms of spinning counted as %v", got)
	}
	if got := CPUTime(-1); got != 0 {
		t.Errorf("no such process: %v, want 0", got)
	}
}
