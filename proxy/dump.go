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

// ruleFingerprints lists the fingerprints of the rules of the family's
// table, by chain and in order: one netlink dump per chain. Expressions are
// not decoded: the fingerprint in each rule's comment says what it is. A
// dump of the whole table would cost O(rules²): the kernel fills one
// buffer of at most 32 KiB per round and starts each round from the
// table's first rule; a chain is found by its name's hash.
func (d Dialer) ruleFingerprints(fam nftables.TableFamily, chains []string) (map[string][]string, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: d.NetNS})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if err := bigBuffers(c); err != nil {
		return nil, err
	}
	out := make(map[string][]string, len(chains))
	for _, chain := range chains {
		fps, err := chainFingerprints(c, fam, chain)
		if err != nil {
			return nil, fmt.Errorf("listing the rules of chain %s: %w", chain, err)
		}
		out[chain] = fps
	}
	return out, nil
}

func chainFingerprints(c *netlink.Conn, fam nftables.TableFamily, chain string) ([]string, error) {
	attrs, err := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.NFTA_RULE_TABLE, Data: []byte(TableName + "\x00")},
		{Type: unix.NFTA_RULE_CHAIN, Data: []byte(chain + "\x00")},
	})
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
		return nil, err
	}
	fps := make([]string, 0, len(msgs))
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return nil, err
		}
		fp := ""
		for ad.Next() {
			if ad.Type() == unix.NFTA_RULE_USERDATA {
				fp, _ = userdata.GetString(ad.Bytes(), userdata.TypeComment)
			}
		}
		if err := ad.Err(); err != nil {
			return nil, err
		}
		fps = append(fps, fp)
	}
	return fps, nil
}
