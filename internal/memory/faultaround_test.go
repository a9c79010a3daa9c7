package memory

import (
	"os"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Read one byte in every 64 kB of a file mapping: registered, only the
// pages read are mapped; not registered, the kernel maps the cached pages
// around each (fault-around), which shows the registration is what makes
// the difference on this kernel.
func TestRegisteredMappingsFaultInOnlyThePagesRead(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(exe) // into the page cache, for fault-around to find
	if err != nil {
		t.Fatal(err)
	}
	size := len(data) &^ (1<<20 - 1)
	if size == 0 {
		t.Skip("the test binary is smaller than 1 MiB")
	}
	cases := []struct {
		registered bool
		fewest     int // pages present, in multiples of the pages read
		most       int
	}{
		{registered: true, fewest: 1, most: 1},
		{registered: false, fewest: 2, most: 16},
	}
	for _, c := range cases {
		f, err := os.Open(exe)
		if err != nil {
			t.Fatal(err)
		}
		m, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ, unix.MAP_PRIVATE)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		start := uintptr(unsafe.Pointer(&m[0]))
		if c.registered {
			fd, err := withoutFaultAround([]addrRange{{start, start + uintptr(size)}})
			if err != nil {
				unix.Munmap(m)
				t.Skipf("no userfaultfd write protection here: %v", err)
			}
			defer unix.Close(fd)
		}
		read, sum := 0, 0
		for off := 0; off < size; off += 64 << 10 {
			sum += int(m[off])
			read++
		}
		sink = sum
		got := presentPages(t, start, size)
		unix.Munmap(m)
		if got < c.fewest*read || got > c.most*read {
			t.Errorf("registered %v: %d pages present after reading %d, want %d to %d", c.registered, got, read, c.fewest*read, c.most*read)
		}
	}
}

// sink keeps the reads from being optimised away.
var sink int

// presentPages counts the pages of [start, start+size) mapped in the
// process (/proc/self/pagemap, bit 63).
func presentPages(t *testing.T, start uintptr, size int) int {
	pm, err := os.Open("/proc/self/pagemap")
	if err != nil {
		t.Fatal(err)
	}
	defer pm.Close()
	buf := make([]byte, size/os.Getpagesize()*8)
	if _, err := pm.ReadAt(buf, int64(start)/int64(os.Getpagesize())*8); err != nil {
		t.Fatal(err)
	}
	n := 0
	for i := 7; i < len(buf); i += 8 {
		n += int(buf[i] >> 7)
	}
	return n
}
