// Package listen opens listeners that more than one process may hold on a
// port at once (SO_REUSEPORT, for processes of the same user): the DNS
// role's sockets, one per CPU, and the node agent's servers, which a new
// agent started beside the running one (a DaemonSet rolled with maxSurge)
// binds before the running one has let go.
package listen

import (
	"context"
	"errors"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// ReusePort is a net.ListenConfig Control that sets SO_REUSEPORT.
func ReusePort(_, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
	})
	return errors.Join(err, serr)
}

// Config is a net.ListenConfig whose sockets share their port.
var Config = net.ListenConfig{Control: ReusePort}

// Shared listens on addr with a socket that shares its port.
func Shared(network, addr string) (net.Listener, error) {
	return Config.Listen(context.Background(), network, addr)
}
