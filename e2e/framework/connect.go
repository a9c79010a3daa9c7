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

// PollConnects waits up to wait for any of the non-blocking connects under
// way on fds to finish and says of each whether it finished, and if so
// whether it was answered (refused, unreachable or reset is finished, not
// answered). The probers that time a change's first allowed connection
// start one attempt after another without waiting, and poll them all.
func PollConnects(fds []int, wait time.Duration) (done, answered []bool, err error) {
	pfds := make([]unix.PollFd, len(fds))
	for i, fd := range fds {
		pfds[i] = unix.PollFd{Fd: int32(fd), Events: unix.POLLOUT}
	}
	if _, err := unix.Poll(pfds, int(wait/time.Millisecond)); err != nil && !errors.Is(err, unix.EINTR) {
		return nil, nil, err
	}
	done, answered = make([]bool, len(fds)), make([]bool, len(fds))
	for i, p := range pfds {
		if p.Revents == 0 {
			continue
		}
		soerr, err := unix.GetsockoptInt(fds[i], unix.SOL_SOCKET, unix.SO_ERROR)
		done[i], answered[i] = true, err == nil && soerr == 0
	}
	return done, answered, nil
}
