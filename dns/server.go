package dns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"syscall"
	"time"

	"github.com/miekg/dns"

	shared "github.com/netplane/netplane/internal/listen"
)

// Listeners are the sockets of one DNS server: several UDP sockets on one
// port with SO_REUSEPORT, so the kernel spreads queries over them and each
// is read by its own goroutine (one socket tops out near 20K queries per
// second however many CPUs there are), and one TCP listener.
type Listeners struct {
	Addr string // the bound host:port
	udp  []net.PacketConn
	tcp  net.Listener
	srv  []*dns.Server
}

// Listen opens udpSockets UDP sockets and a TCP listener on addr (port 0
// picks a port free for both protocols, the same for all sockets). It opens
// sockets in the calling thread's network namespace.
func Listen(addr string, udpSockets int) (*Listeners, error) {
	_, port, _ := net.SplitHostPort(addr)
	for tries := 1; ; tries++ {
		l, err := listen(addr, udpSockets)
		// A port the kernel picked free for UDP may be taken for TCP.
		if port != "0" || tries == 10 || !errors.Is(err, syscall.EADDRINUSE) {
			return l, err
		}
	}
}

func listen(addr string, udpSockets int) (*Listeners, error) {
	lc := shared.Config
	l := &Listeners{}
	first, err := lc.ListenPacket(context.Background(), "udp", addr)
	if err != nil {
		return nil, fmt.Errorf("DNS server cannot listen on UDP %s: %w (is another DNS server running there, or does the process lack CAP_NET_BIND_SERVICE?)", addr, err)
	}
	l.udp = append(l.udp, first)
	host, _, _ := net.SplitHostPort(addr)
	l.Addr = net.JoinHostPort(host, strconv.Itoa(first.LocalAddr().(*net.UDPAddr).Port))
	for i := 1; i < udpSockets; i++ {
		pc, err := lc.ListenPacket(context.Background(), "udp", l.Addr)
		if err != nil {
			l.Close()
			return nil, fmt.Errorf("DNS server cannot open UDP socket %d on %s: %w", i+1, l.Addr, err)
		}
		l.udp = append(l.udp, pc)
	}
	if l.tcp, err = lc.Listen(context.Background(), "tcp", l.Addr); err != nil {
		l.Close()
		return nil, fmt.Errorf("DNS server cannot listen on TCP %s: %w", l.Addr, err)
	}
	return l, nil
}

// Serve answers queries on every socket with h until Shutdown: UDP by
// the sockets' own loops (udp.go), TCP by miekg/dns's server.
func (l *Listeners) Serve(h *Handler) {
	for _, pc := range l.udp {
		go newUDPSocket(h, pc.(*net.UDPConn)).serve()
	}
	l.srv = append(l.srv, &dns.Server{Listener: l.tcp, Handler: h,
		// Idle TCP clients are dropped after CoreDNS's 10 s.
		IdleTimeout: func() time.Duration { return 10 * time.Second }})
	for _, s := range l.srv {
		go func() { _ = s.ActivateAndServe() }()
	}
}

// Shutdown stops serving and closes the sockets.
func (l *Listeners) Shutdown(ctx context.Context) {
	for _, s := range l.srv {
		_ = s.ShutdownContext(ctx)
	}
	l.Close()
}

// Close closes the sockets.
func (l *Listeners) Close() {
	for _, pc := range l.udp {
		pc.Close()
	}
	if l.tcp != nil {
		l.tcp.Close()
	}
}
