package proxy

import (
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Dialer opens netlink sockets in one network namespace.
type Dialer struct {
	// NetNS is a file descriptor of the namespace; 0 means the caller's.
	NetNS int
}

// ruleFingerprints lists the fingerprints of every rule of the family's
// table, by chain and in order, in one netlink dump. Expressions are not
// decoded: the fingerprint in each rule's comment says what it is, which
// keeps a full sync over a big table cheap.
func (d Dialer) ruleFingerprints(fam nftables.TableFamily) (map[string][]string, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: d.NetNS})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if err := bigBuffers(c); err != nil {
		return nil, err
	}
	attrs, err := netlink.MarshalAttributes([]netlink.Attribute{{Type: unix.NFTA_RULE_TABLE, Data: []byte(TableName + "\x00")}})
	if err != nil {
		return nil, err
	}
	req := netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETRULE),
			Flags: netlink.Request | netlink.Dump,
		},
		Data: append([]byte{byte(fam), unix.NFNETLINK_V0, 0, 0}, attrs...),
	}
	var msgs []netlink.Message
	for try := 0; ; try++ {
		// A dump interrupted by a concurrent change is simply repeated.
		if msgs, err = c.Execute(req); err == nil || try == 2 {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("listing rules: %w", err)
	}
	out := map[string][]string{}
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return nil, err
		}
		var chain, fp string
		for ad.Next() {
			switch ad.Type() {
			case unix.NFTA_RULE_CHAIN:
				chain = ad.String()
			case unix.NFTA_RULE_USERDATA:
				fp, _ = userdata.GetString(ad.Bytes(), userdata.TypeComment)
			}
		}
		if err := ad.Err(); err != nil {
			return nil, err
		}
		out[chain] = append(out[chain], fp)
	}
	return out, nil
}
