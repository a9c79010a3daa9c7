package wireguard

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// WireGuard's cross-platform configuration protocol, the text wireguard-go
// reads and writes in IpcSet and IpcGet
// (https://www.wireguard.com/xplatform/#configuration-protocol): key=value
// lines, keys in hex, each peer's lines after its public_key.

// encodeUAPI is cfg as a "set" body.
func encodeUAPI(cfg wgtypes.Config) string {
	var b strings.Builder
	line := func(k, v string) { b.WriteString(k + "=" + v + "\n") }
	if cfg.PrivateKey != nil {
		line("private_key", hex.EncodeToString(cfg.PrivateKey[:]))
	}
	if cfg.ListenPort != nil {
		line("listen_port", strconv.Itoa(*cfg.ListenPort))
	}
	if cfg.FirewallMark != nil {
		line("fwmark", strconv.Itoa(*cfg.FirewallMark))
	}
	if cfg.ReplacePeers {
		line("replace_peers", "true")
	}
	for _, p := range cfg.Peers {
		line("public_key", hex.EncodeToString(p.PublicKey[:]))
		if p.Remove {
			line("remove", "true")
			continue
		}
		if p.UpdateOnly {
			line("update_only", "true")
		}
		if p.PresharedKey != nil {
			line("preshared_key", hex.EncodeToString(p.PresharedKey[:]))
		}
		if p.Endpoint != nil {
			line("endpoint", p.Endpoint.String())
		}
		if p.PersistentKeepaliveInterval != nil {
			line("persistent_keepalive_interval", strconv.Itoa(int(p.PersistentKeepaliveInterval.Seconds())))
		}
		if p.ReplaceAllowedIPs {
			line("replace_allowed_ips", "true")
		}
		for _, n := range p.AllowedIPs {
			line("allowed_ip", n.String())
		}
	}
	return b.String()
}

// decodeUAPI reads a "get" answer into a device named name.
func decodeUAPI(name, text string) (*wgtypes.Device, error) {
	d := &wgtypes.Device{Name: name, Type: wgtypes.Userspace}
	var p *wgtypes.Peer
	var sec, nsec int64
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "=")
		if !ok {
			continue
		}
		var err error
		switch k {
		case "private_key":
			d.PrivateKey, err = hexKey(v)
			d.PublicKey = d.PrivateKey.PublicKey()
		case "listen_port":
			d.ListenPort, err = strconv.Atoi(v)
		case "fwmark":
			d.FirewallMark, err = strconv.Atoi(v)
		case "public_key":
			d.Peers = append(d.Peers, wgtypes.Peer{})
			p = &d.Peers[len(d.Peers)-1]
			p.PublicKey, err = hexKey(v)
		case "errno":
			if v != "0" {
				err = fmt.Errorf("errno %s", v)
			}
		default:
			if p == nil {
				return nil, fmt.Errorf("WireGuard device %s answered %q before any peer", name, k)
			}
			err = peerField(p, k, v, &sec, &nsec)
		}
		if err != nil {
			return nil, fmt.Errorf("WireGuard device %s answered %s=%q: %w", name, k, v, err)
		}
	}
	return d, sc.Err()
}

// peerField sets one peer line of a "get" answer; the handshake time
// comes in two lines, seconds then nanoseconds.
func peerField(p *wgtypes.Peer, k, v string, sec, nsec *int64) error {
	var err error
	switch k {
	case "preshared_key":
		p.PresharedKey, err = hexKey(v)
	case "endpoint":
		var ap netip.AddrPort
		if ap, err = netip.ParseAddrPort(v); err == nil {
			p.Endpoint = net.UDPAddrFromAddrPort(ap)
		}
	case "last_handshake_time_sec":
		*sec, err = strconv.ParseInt(v, 10, 64)
	case "last_handshake_time_nsec":
		*nsec, err = strconv.ParseInt(v, 10, 64)
		if err == nil && (*sec != 0 || *nsec != 0) {
			p.LastHandshakeTime = time.Unix(*sec, *nsec)
		}
	case "tx_bytes":
		p.TransmitBytes, err = strconv.ParseInt(v, 10, 64)
	case "rx_bytes":
		p.ReceiveBytes, err = strconv.ParseInt(v, 10, 64)
	case "persistent_keepalive_interval":
		var s int
		s, err = strconv.Atoi(v)
		p.PersistentKeepaliveInterval = time.Duration(s) * time.Second
	case "allowed_ip":
		var n *net.IPNet
		if _, n, err = net.ParseCIDR(v); err == nil {
			p.AllowedIPs = append(p.AllowedIPs, *n)
		}
	case "protocol_version":
		p.ProtocolVersion, err = strconv.Atoi(v)
	}
	return err
}

func hexKey(s string) (wgtypes.Key, error) {
	b, err := hex.DecodeString(s)
	if err != nil {
		return wgtypes.Key{}, err
	}
	return wgtypes.NewKey(b)
}
