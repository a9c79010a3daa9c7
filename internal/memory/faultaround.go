package memory

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// PagesOneByOne makes the executable's code and constants, once dropped
// (DropExecutablePages), come back one page at a time, only those read.
// On a read fault the kernel maps not only the page read but every page
// of the file's cache in the 64 kB around it ("fault-around"): a process
// that reads a few bytes here and there of the runtime's function tables
// (the collector's stack scans, stack growth) and of its type descriptors
// has them resident 64 kB at a time. Measured on the DNS role serving
// 2,000 Services: 13.7 MB of the executable resident, all of it in whole
// 64 kB windows; registered, 4.1 MB, the pages actually read.
//
// There is no per-process setting for it; the kernel skips fault-around
// on mappings registered with a userfaultfd for write protection, which
// a read-only mapping never uses. With UFFD_FEATURE_WP_ASYNC (Linux 6.7)
// any mapping can be registered and no fault is ever reported to the
// process, and UFFD_USER_MODE_ONLY needs no privilege. The descriptor is
// kept open for the life of the process. An error (an older kernel, a
// seccomp profile refusing userfaultfd) leaves the mappings as they were.
func PagesOneByOne() error {
	oneByOne.Do(func() {
		exe, err := os.Readlink("/proc/self/exe")
		if err != nil {
			oneByOne.err = err
			return
		}
		smaps, err := os.ReadFile("/proc/self/smaps")
		if err != nil {
			oneByOne.err = err
			return
		}
		oneByOne.fd, oneByOne.err = withoutFaultAround(pristineMappings(string(smaps), exe))
	})
	return oneByOne.err
}

var oneByOne struct {
	sync.Once
	fd  int // never closed: closing unregisters
	err error
}

// The userfaultfd ABI (linux/userfaultfd.h).
const (
	uffdUserModeOnly   = 1
	uffdAPI            = 0xaa
	uffdFeatureWPAsync = 1 << 15
	uffdRegisterModeWP = 1 << 1
	uffdioAPI          = 0xc018aa3f // _IOWR(0xAA, 0x3F, struct uffdio_api)
	uffdioRegister     = 0xc020aa00 // _IOWR(0xAA, 0x00, struct uffdio_register)
)

// withoutFaultAround registers ranges for asynchronous write protection
// on a new userfaultfd, returned open when it succeeds: closing it ends
// the registration.
func withoutFaultAround(ranges []addrRange) (int, error) {
	if len(ranges) == 0 {
		return -1, errors.New("no read-only mapping of the executable")
	}
	fd, _, e := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK|uffdUserModeOnly, 0, 0)
	if e != 0 {
		return -1, fmt.Errorf("userfaultfd: %w", e)
	}
	api := struct{ api, features, ioctls uint64 }{api: uffdAPI, features: uffdFeatureWPAsync}
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, fd, uffdioAPI, uintptr(unsafe.Pointer(&api))); e != 0 {
		unix.Close(int(fd))
		return -1, fmt.Errorf("userfaultfd: asynchronous write protection: %w", e)
	}
	for _, r := range ranges {
		reg := struct{ start, len, mode, ioctls uint64 }{start: uint64(r.start), len: uint64(r.end - r.start), mode: uffdRegisterModeWP}
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, fd, uffdioRegister, uintptr(unsafe.Pointer(&reg))); e != 0 {
			unix.Close(int(fd)) // unregisters what was
			return -1, fmt.Errorf("userfaultfd: registering %#x-%#x: %w", r.start, r.end, e)
		}
	}
	return int(fd), nil
}
