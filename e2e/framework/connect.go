package framework

import (
	"errors"
	"time"

	"golang.org/x/sys/unix"
)

// WaitConnected waits up to limit for the connect under way on fd (a
// non-blocking one, or a blocking one a signal interrupted) to finish, and
// returns its outcome; ETIMEDOUT when limit passed first.
func WaitConnected(fd int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return unix.ETIMEDOUT
		}
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
		n, err := unix.Poll(pfd, int(left/time.Millisecond)+1)
		if errors.Is(err, unix.EINTR) || (err == nil && n == 0) {
			continue
		}
		if err != nil {
			return err
		}
		soerr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
		if err != nil {
			return err
		}
		if soerr != 0 {
			return unix.Errno(soerr)
		}
		return nil
	}
}
