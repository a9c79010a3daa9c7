package nft

import (
	"fmt"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// PacketCounter reads what the counters of a table's rules counted: the
// kernel's Programmer, or a Fake (Fake.Count). It is safe to call beside a
// sync, from a metrics scrape.
type PacketCounter interface {
	// Packets are the packets the counter expressions (`counter`) of the
	// named chains' rules counted, summed by chain; a chain the table
	// lacks counted none.
	Packets(chains ...string) (map[string]uint64, error)
}

var (
	_ PacketCounter = (*Programmer)(nil)
	_ PacketCounter = (*Fake)(nil)
)

// Packets reads the table's counters over a connection of its own, so
// that a scrape never shares the programmer's.
func (p *Programmer) Packets(chains ...string) (map[string]uint64, error) {
	return p.k.packets(chains)
}

func (k *netlinkKernel) packets(chains []string) (map[string]uint64, error) {
	return Packets(k.dialer, k.id, chains...)
}

// Packets reads, in the namespace of d, what the counter expressions of the
// named chains of table counted (PacketCounter.Packets).
func Packets(d Dialer, table TableID, chains ...string) (map[string]uint64, error) {
	c, err := d.conn()
	if err != nil {
		return nil, err
	}
	out := make(map[string]uint64, len(chains))
	t := &nftables.Table{Family: table.Family, Name: table.Name}
	for _, name := range chains {
		rules, err := c.GetRules(t, &nftables.Chain{Name: name, Table: t})
		if err != nil {
			return nil, fmt.Errorf("reading chain %s of table %s: %w", name, table, err)
		}
		for _, r := range rules {
			for _, e := range r.Exprs {
				if n, ok := e.(*expr.Counter); ok {
					out[name] += n.Packets
				}
			}
		}
	}
	return out, nil
}

// conn is a connection for one request in the namespace of d.
func (d Dialer) conn() (*nftables.Conn, error) {
	var opts []nftables.ConnOption
	if d.NetNS != 0 {
		opts = append(opts, nftables.WithNetNSFd(d.NetNS))
	}
	c, err := nftables.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("opening an nftables netlink socket (needs CAP_NET_ADMIN): %w", err)
	}
	return c, nil
}

// fakeCounts are the packets a Fake's chains counted, as a test sets them.
type fakeCounts struct {
	mu sync.Mutex
	n  map[string]uint64
}

// Count sets what the counters of chain have counted, as packets through
// the kernel would; a chain the table lacks counts none whatever is set.
func (f *Fake) Count(chain string, packets uint64) {
	f.k.counts.mu.Lock()
	defer f.k.counts.mu.Unlock()
	if f.k.counts.n == nil {
		f.k.counts.n = map[string]uint64{}
	}
	f.k.counts.n[chain] = packets
}

func (k *fakeKernel) packets(chains []string) (map[string]uint64, error) {
	k.counts.mu.Lock()
	defer k.counts.mu.Unlock()
	out := make(map[string]uint64, len(chains))
	for _, name := range chains {
		if k.t != nil && k.t.chains[name] != nil {
			out[name] = k.counts.n[name]
		}
	}
	return out, nil
}
