package proxy

import (
	"context"
	"encoding/binary"
	"hash/crc32"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/netplane/netplane/e2e/netns"
)

// SCTP flows without an SCTP stack. This kernel has SCTP conntrack and NAT
// (CONFIG_NF_CT_PROTO_SCTP=y) but no SCTP sockets (CONFIG_IP_SCTP is not
// set, and there are no modules to load), which is all a proxy needs: the
// client sends an SCTP INIT through a raw socket, and raw listeners in the
// pods report which pod it reached and the source address it arrived from.
// The INIT's initiate tag, which NAT leaves alone, ties the two together.

// sctpPort is the endpoints' SCTP port (the slices' "sctp" port).
const sctpPort = 9999

// sctpLab collects the INITs the pods received, by initiate tag.
type sctpLab struct {
	mu   sync.Mutex
	seen map[uint32]string // tag → "<pod> <source address>"
}

func newSCTPLab() *sctpLab { return &sctpLab{seen: map[uint32]string{}} }

// listen opens raw SCTP sockets on the pod's addresses (in the pod's
// namespace) and records every INIT to sctpPort.
func (s *sctpLab) listen(t *testing.T, pod *netns.NS, name string, ips ...string) {
	for _, ip := range ips {
		network := "ip4:132"
		if netip.MustParseAddr(ip).Is6() {
			network = "ip6:132"
		}
		var c *net.IPConn
		err := pod.Do(func() (err error) {
			c, err = net.ListenIP(network, &net.IPAddr{IP: net.ParseIP(ip)})
			return err
		})
		if err != nil {
			t.Fatalf("raw SCTP socket in %s: %v", name, err)
		}
		t.Cleanup(func() { c.Close() })
		go s.serve(c, name)
	}
}

func (s *sctpLab) serve(c *net.IPConn, name string) {
	buf := make([]byte, 1500)
	for {
		n, from, err := c.ReadFromIP(buf)
		if err != nil {
			return
		}
		tag, dport, ok := parseSCTPInit(buf[:n])
		if !ok || dport != sctpPort {
			continue
		}
		src, _ := netip.AddrFromSlice(from.IP)
		s.mu.Lock()
		s.seen[tag] = name + " " + src.Unmap().String()
		s.mu.Unlock()
	}
}

// probe sends one INIT from ns to addr (a fresh association: new source
// port and tag, so a new conntrack entry) and returns "<pod> <source seen>"
// or "timeout".
func (s *sctpLab) probe(ns *netns.NS, addr string) string {
	ap := netip.MustParseAddrPort(addr)
	network := "ip4:132"
	if ap.Addr().Is6() {
		network = "ip6:132"
	}
	tag := rand.Uint32() | 1
	pkt := sctpInit(uint16(32768+rand.IntN(28000)), ap.Port(), tag)
	err := ns.Do(func() error {
		c, err := net.DialIP(network, nil, &net.IPAddr{IP: ap.Addr().AsSlice()})
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write(pkt)
		return err
	})
	if err != nil {
		return err.Error()
	}
	var got string
	err = wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, time.Second, true, func(context.Context) (bool, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		var ok bool
		got, ok = s.seen[tag]
		return ok, nil
	})
	if err != nil {
		return "timeout"
	}
	return got
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// sctpInit is an SCTP packet holding one INIT chunk (RFC 9260 3.3.2). The
// verification tag of an INIT is 0; the checksum is CRC32c, which
// conntrack verifies before it lets the packet be NATed.
func sctpInit(sport, dport uint16, tag uint32) []byte {
	b := make([]byte, 12+20)
	binary.BigEndian.PutUint16(b[0:], sport)
	binary.BigEndian.PutUint16(b[2:], dport)
	b[12] = 1                                   // chunk type INIT
	binary.BigEndian.PutUint16(b[14:], 20)      // chunk length
	binary.BigEndian.PutUint32(b[16:], tag)     // initiate tag
	binary.BigEndian.PutUint32(b[20:], 65535)   // advertised receiver window
	binary.BigEndian.PutUint16(b[24:], 1)       // outbound streams
	binary.BigEndian.PutUint16(b[26:], 1)       // inbound streams
	binary.BigEndian.PutUint32(b[28:], tag^0xa) // initial TSN
	binary.LittleEndian.PutUint32(b[8:], crc32.Checksum(b, castagnoli))
	return b
}

// parseSCTPInit returns the initiate tag and destination port of an INIT
// with a valid checksum (a NAT that forgot to fix it up fails here).
func parseSCTPInit(b []byte) (tag uint32, dport uint16, ok bool) {
	if len(b) < 32 || b[12] != 1 {
		return 0, 0, false
	}
	sum := binary.LittleEndian.Uint32(b[8:])
	c := append([]byte(nil), b...)
	clear(c[8:12])
	if crc32.Checksum(c, castagnoli) != sum {
		return 0, 0, false
	}
	return binary.BigEndian.Uint32(b[16:]), binary.BigEndian.Uint16(b[2:]), true
}
