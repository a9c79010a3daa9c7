package framework

import (
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestPollConnectsTellsAnsweredFromRefused starts one non-blocking connect
// to a listening loopback port and one to a closed port: the first is
// finished and answered, the second finished and not answered.
func TestPollConnectsTellsAnsweredFromRefused(t *testing.T) {
	open, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	closed, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedPort := closed.Addr().(*net.TCPAddr).Port
	closed.Close()
	var fds []int
	for _, port := range []int{open.Addr().(*net.TCPAddr).Port, closedPort} {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		if err := unix.Connect(fd, &unix.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}); err != nil && err != unix.EINPROGRESS && err != unix.ECONNREFUSED {
			t.Fatal(err)
		}
		fds = append(fds, fd)
	}
	want := [][2]bool{{true, true}, {true, false}}
	for deadline := time.Now().Add(5 * time.Second); ; {
		done, answered, err := PollConnects(fds, 10*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if done[0] && done[1] {
			for i := range fds {
				if got := [2]bool{done[i], answered[i]}; got != want[i] {
					t.Errorf("connect %d: got (done, answered) %v, want %v", i, got, want[i])
				}
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("connects not finished after 5s: done %v", done)
		}
	}
}
