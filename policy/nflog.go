package policy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/netplane/netplane/nft"
)

// This file logs denied connections (--network-policy-log-denied). The
// deny chains hand the first packets of denied connections, at most
// logRate a second per direction, to NFLOG group LogGroup before dropping
// them; the verdict is the kernel's alone. Here they are read from a
// netfilter netlink socket, their IP and transport headers parsed, and one
// line is written per connection with the pod the policy protects.

// NFLOG's netlink constants (linux/netfilter/nfnetlink_log.h); x/sys/unix
// has only the subsystem's number.
const (
	nfulnlMsgPacket = 0
	nfulnlMsgConfig = 1

	nfulaCfgCmd    = 1
	nfulaCfgMode   = 2
	nfulaCfgQThres = 5
	nfulnlCmdBind  = 1
	nfulnlCopyPkt  = 2

	nfulaPayload = 9
	nfulaPrefix  = 10
)

// seenFor is how long a connection logged once is not logged again: a
// denied TCP client retries its SYN for about a minute.
const seenFor = time.Minute

// logDenied listens to the NFLOG group until ctx ends. Enforcement does
// not depend on it: if the group cannot be had, it says so and returns.
func (f *Feature) logDenied(ctx context.Context) {
	c, err := listenNFLOG(f.dialer, LogGroup)
	if err != nil {
		f.log.Error(err, "denied connections are not logged", "nflogGroup", LogGroup)
		return
	}
	go func() { <-ctx.Done(); c.Close() }()
	seen := map[deniedPacket]time.Time{}
	for {
		msgs, err := c.Receive()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if errors.Is(err, unix.ENOBUFS) {
				continue // the socket overflowed: some packets are not logged
			}
			f.log.Error(err, "reading denied packets; no more are logged", "nflogGroup", LogGroup)
			return
		}
		now := time.Now()
		for _, m := range msgs {
			p, ok := parseNFLOG(m)
			if !ok || now.Sub(seen[p]) < seenFor {
				continue
			}
			if len(seen) > 4096 {
				for k, t := range seen {
					if now.Sub(t) >= seenFor {
						delete(seen, k)
					}
				}
			}
			seen[p] = now
			f.logPacket(p)
		}
	}
}

func (f *Feature) logPacket(p deniedPacket) {
	protected := p.Dst.Addr()
	if p.Dir == Egress {
		protected = p.Src.Addr()
	}
	f.mu.Lock()
	pod, ok := f.model.LocalPod(protected)
	f.mu.Unlock()
	name := "(no pod of this node)"
	if ok {
		name = pod.String()
	}
	kv := []any{"direction", p.Dir.String(), "protocol", nft.ProtoName(p.Proto),
		"source", p.Src.String(), "destination", p.Dst.String(), "port", p.Dst.Port(), "pod", name}
	if tier, policy, ok := strings.Cut(p.By, ":"); ok {
		kv = append(kv, "tier", tier, "clusterNetworkPolicy", policy)
	} else {
		kv = append(kv, "tier", "NetworkPolicy")
	}
	f.log.Info("denied connection", kv...)
}

// listenNFLOG binds a netfilter socket to an NFLOG group, copying
// logSnaplen bytes of each packet and handing each over at once.
func listenNFLOG(d nft.Dialer, group uint16) (*netlink.Conn, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: d.NetNS})
	if err != nil {
		return nil, fmt.Errorf("opening a netfilter netlink socket: %w", err)
	}
	_ = c.SetReadBuffer(1 << 20)
	mode := binary.BigEndian.AppendUint32(nil, logSnaplen)
	for _, a := range []netlink.Attribute{
		{Type: nfulaCfgCmd, Data: []byte{nfulnlCmdBind}},
		{Type: nfulaCfgMode, Data: append(mode, nfulnlCopyPkt, 0)},
		{Type: nfulaCfgQThres, Data: binary.BigEndian.AppendUint32(nil, 1)},
	} {
		attrs, err := netlink.MarshalAttributes([]netlink.Attribute{a})
		if err != nil {
			c.Close()
			return nil, err
		}
		msg := netlink.Message{
			Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_ULOG<<8 | nfulnlMsgConfig), Flags: netlink.Request | netlink.Acknowledge},
			Data:   append([]byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, byte(group >> 8), byte(group)}, attrs...),
		}
		if _, err := c.Execute(msg); err != nil {
			c.Close()
			return nil, fmt.Errorf("configuring NFLOG group %d (is another program bound to it?): %w", group, err)
		}
	}
	return c, nil
}

// deniedPacket is what a log line says of a denied packet; comparable, so
// it keys the connections logged already.
type deniedPacket struct {
	Dir      Direction
	Proto    uint8
	Src, Dst netip.AddrPort // ports 0 for protocols without
	// By is "<tier>:<name>" of the ClusterNetworkPolicy that denied it,
	// from the prefix of its deny chain; "" for NetworkPolicy.
	By string
}

// parseNFLOG reads an NFLOG packet message: the direction (and the
// ClusterNetworkPolicy) from the prefix the deny chain gave it, the rest
// from the packet's headers.
func parseNFLOG(m netlink.Message) (deniedPacket, bool) {
	var p deniedPacket
	if m.Header.Type != netlink.HeaderType(unix.NFNL_SUBSYS_ULOG<<8|nfulnlMsgPacket) || len(m.Data) < 4 {
		return p, false
	}
	ad, err := netlink.NewAttributeDecoder(m.Data[4:]) // after the nfgenmsg
	if err != nil {
		return p, false
	}
	var prefix string
	var payload []byte
	for ad.Next() {
		switch ad.Type() {
		case nfulaPrefix:
			prefix = ad.String()
		case nfulaPayload:
			payload = ad.Bytes()
		}
	}
	if ad.Err() != nil || !strings.HasPrefix(prefix, logPrefix) {
		return p, false
	}
	dir, by, _ := strings.Cut(strings.TrimSpace(strings.TrimPrefix(prefix, logPrefix)), " ")
	p.By = by
	switch dir {
	case Ingress.String():
		p.Dir = Ingress
	case Egress.String():
		p.Dir = Egress
	default:
		return p, false
	}
	return parsePacket(p, payload)
}

// parsePacket fills in the protocol, addresses and ports from an IPv4 or
// IPv6 packet's headers.
func parsePacket(p deniedPacket, b []byte) (deniedPacket, bool) {
	var src, dst netip.Addr
	var l4 []byte
	switch {
	case len(b) >= 20 && b[0]>>4 == 4:
		ihl := int(b[0]&0x0f) * 4
		if ihl < 20 || len(b) < ihl {
			return p, false
		}
		p.Proto = b[9]
		src, dst = netip.AddrFrom4([4]byte(b[12:16])), netip.AddrFrom4([4]byte(b[16:20]))
		if binary.BigEndian.Uint16(b[6:8])&0x1fff == 0 { // a later fragment has no transport header
			l4 = b[ihl:]
		}
	case len(b) >= 40 && b[0]>>4 == 6:
		src, dst = netip.AddrFrom16([16]byte(b[8:24])), netip.AddrFrom16([16]byte(b[24:40]))
		p.Proto, l4 = ipv6Transport(b[6], b[40:])
	default:
		return p, false
	}
	var sport, dport uint16
	if (p.Proto == unix.IPPROTO_TCP || p.Proto == unix.IPPROTO_UDP || p.Proto == unix.IPPROTO_SCTP) && len(l4) >= 4 {
		sport, dport = binary.BigEndian.Uint16(l4[0:2]), binary.BigEndian.Uint16(l4[2:4])
	}
	p.Src, p.Dst = netip.AddrPortFrom(src, sport), netip.AddrPortFrom(dst, dport)
	return p, true
}

// ipv6Transport skips IPv6 extension headers to the transport header:
// its protocol, and its bytes (none after a fragment other than the first).
func ipv6Transport(next uint8, b []byte) (uint8, []byte) {
	for range 8 {
		switch next {
		case unix.IPPROTO_HOPOPTS, unix.IPPROTO_ROUTING, unix.IPPROTO_DSTOPTS:
			if len(b) < 8 || len(b) < (int(b[1])+1)*8 {
				return next, nil
			}
			next, b = b[0], b[(int(b[1])+1)*8:]
		case unix.IPPROTO_FRAGMENT:
			if len(b) < 8 {
				return next, nil
			}
			if binary.BigEndian.Uint16(b[2:4])&0xfff8 != 0 {
				return b[0], nil
			}
			next, b = b[0], b[8:]
		default:
			return next, b
		}
	}
	return next, nil
}
