package nft

import (
	"fmt"
	"io/fs"
	"slices"

	"github.com/google/nftables"
)

// Replace makes the kernel's table exactly want in one transaction: it
// creates the table if it is missing, deletes it with everything in it,
// and adds want whole, so packets meet the old rules or the new, never a
// mix nor none. It is for small tables rewritten on every change, where a
// rewrite costs less than remembering what the kernel has, and heals what
// others changed on the way; a big table wants a Programmer.
func Replace(d Dialer, want *Table) error {
	p := newPlan(newKernelTable())
	p.whole = true
	p.add(step{op: opAddTable})
	p.add(step{op: opDelTable})
	if err := p.diff(newKernelTable(), want, true, true); err != nil {
		return fmt.Errorf("replacing table %s: %w", want.ID(), err)
	}
	if err := sendOnce(d, want.ID(), p); err != nil {
		return fmt.Errorf("replacing table %s: %w", want.ID(), err)
	}
	return nil
}

// Delete deletes table, if it is there, in one transaction.
func Delete(d Dialer, table TableID) error {
	p := newPlan(newKernelTable())
	p.add(step{op: opAddTable})
	p.add(step{op: opDelTable})
	if err := sendOnce(d, table, p); err != nil {
		return fmt.Errorf("deleting table %s: %w", table, err)
	}
	return nil
}

// Exists reports whether the kernel has table.
func Exists(d Dialer, table TableID) (bool, error) {
	c, err := d.conn()
	if err != nil {
		return false, err
	}
	tables, err := c.ListTablesOfFamily(table.Family)
	if err != nil {
		return false, fmt.Errorf("listing %s tables: %w", familyName(table.Family), err)
	}
	return slices.ContainsFunc(tables, func(t *nftables.Table) bool { return t.Name == table.Name }), nil
}

// sendOnce sends a plan for table over a connection of its own.
func sendOnce(d Dialer, table TableID, p *plan) error {
	k := &netlinkKernel{dialer: d, id: table}
	c, w, err := k.dial()
	if err != nil {
		return fmt.Errorf("opening an nftables netlink socket (needs CAP_NET_ADMIN): %w", err)
	}
	k.conn, k.writer = c, w
	defer k.reset()
	_, err = p.send(k)
	return err
}

// RuleFingerprints lists the fingerprints of the rules of the named chains
// of table, in order, by chain, for a check that must change nothing (a
// CNI CHECK): a desired rule is in the kernel when its Rule.FP is listed.
// A table or chain the kernel does not have is an error that
// errors.Is(err, fs.ErrNotExist).
func RuleFingerprints(d Dialer, table TableID, chains ...string) (map[string][]string, error) {
	c, err := d.conn()
	if err != nil {
		return nil, err
	}
	// A dump of the rules of a table or chain that is not there is empty,
	// not an error: the chains are looked up first.
	have, err := c.ListChainsOfTableFamily(table.Family)
	if err != nil {
		return nil, fmt.Errorf("listing the chains of table %s: %w", table, err)
	}
	for _, name := range chains {
		if !slices.ContainsFunc(have, func(ch *nftables.Chain) bool { return ch.Table.Name == table.Name && ch.Name == name }) {
			return nil, fmt.Errorf("chain %s of table %s: %w", name, table, fs.ErrNotExist)
		}
	}
	dump, err := d.dumper(table)
	if err != nil {
		return nil, fmt.Errorf("opening an nftables netlink socket: %w", err)
	}
	defer dump.close()
	return dump.ruleFingerprints(chains)
}
