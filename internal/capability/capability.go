// Package capability makes the capabilities that netplane's image grants
// its binary effective in the running process.
//
// The image gives /usr/local/bin/netplane CAP_NET_BIND_SERVICE as a file
// capability that is permitted but not effective. With the effective bit
// set the kernel refuses to execute the binary at all where the bounding
// set lacks the capability, as in the node agent's container (which drops
// ALL and adds NET_ADMIN and NET_RAW) and the controller's (which drops
// ALL). Only the DNS role, run as a non-root user, needs it, to bind port
// 53: it is made effective here, on every thread of the process.
package capability

import (
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// RaisePermitted makes every permitted capability effective, on every
// thread; where they already are (root, or a process granted nothing) it
// does nothing.
func RaisePermitted() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return err
	}
	if !Raise(&data) {
		return nil
	}
	// Capabilities are per thread, and the Go runtime runs goroutines on
	// several: capset on one would leave the others without.
	_, _, errno := syscall.AllThreadsSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// Raise sets the effective sets to the permitted ones and says whether
// anything changed.
func Raise(data *[2]unix.CapUserData) bool {
	changed := false
	for i := range data {
		if data[i].Effective != data[i].Permitted {
			data[i].Effective, changed = data[i].Permitted, true
		}
	}
	return changed
}
