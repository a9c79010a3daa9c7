package framework

import (
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestCPUTimeCountsThisProcess burns 200 ms of CPU, as the kernel's own
// accounting of this process says (getrusage), and reads it back from
// /proc: a wall-clock spin is descheduled on a busy machine.
func TestCPUTimeCountsThisProcess(t *testing.T) {
	used := func() time.Duration {
		var ru unix.Rusage
		if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
			t.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	start, before := used(), CPUTime(os.Getpid())
	for used()-start < 200*time.Millisecond {
	}
	want, got := used()-start, CPUTime(os.Getpid())-before
	// /proc counts in clock ticks of 10 ms.
	if got < want-30*time.Millisecond || got > want+30*time.Millisecond {
		t.Errorf("%v of CPU counted as %v", want, got)
	}
	if got := CPUTime(-1); got != 0 {
		t.Errorf("no such process: %v, want 0", got)
	}
}
