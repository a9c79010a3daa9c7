package proxy

import (
	"math"
	"math/bits"
	"slices"
	"strings"

	"github.com/google/nftables/expr"
)

// Sized sets. A hash set created with a size is a fixed table in the
// kernel (nft_set_hash); one without is a resizable one (rhashtable),
// which doubles in a worker as elements come, every insertion meanwhile
// taking a slow path: a third of the kernel's time in a big sync. The size
// is also a cap, so a set about to outgrow it, or left far below it, is
// replaced by one of a fitting size under its other name (otherName),
// made before the old one is broken: created and filled, then every chain
// reading it rewritten to read the new one, then the old one deleted.
// Dynamic sets (affinity) stay resizable: the fixed table has no timeouts.

// sizeFor is the size for n elements. The kernel gives a set of size s
// the power of two at or above 4s/3 buckets; the size is three quarters of
// the power of two at or above 2n, so the table is at most half full with
// n elements and takes half as many more before it must be replaced (a
// sync adds before it removes). At least 256 buckets, 2 KiB.
func sizeFor(n int) uint32 {
	buckets := max(256, 1<<bits.Len(uint(max(2*n-1, 1))))
	return uint32(buckets / 4 * 3)
}

// minSetSize is the size of the smallest table.
const minSetSize = 192

// outgrown says whether a set of size holding have elements needs
// replacing to take adds more (the removals come after the additions) or,
// when shrinking is allowed, to hold want: down to an eighth of its size.
func outgrown(size uint32, have, adds, want int, shrink bool) bool {
	if size == 0 {
		return true // made by a version before sized sets
	}
	return have+adds > int(size) || (shrink && size > minSetSize && 8*want < int(size))
}

// capacity is how many elements a set of size takes.
func capacity(size uint32) uint32 {
	if size == 0 {
		return math.MaxUint32
	}
	return size
}

// otherSuffix marks a set's other name.
const otherSuffix = "-b"

// otherName is the name to replace the kernel's set current, of the
// desired set name, under.
func otherName(name, current string) string {
	if current == name {
		return name + otherSuffix
	}
	return name
}

// logicalName is the desired set a kernel set stands for.
func logicalName(kernel string) string { return strings.TrimSuffix(kernel, otherSuffix) }

// setsRead are the named sets the rule's expressions read or update.
func setsRead(rl Rule) []string {
	var out []string
	for _, e := range rl.Exprs {
		switch e := e.(type) {
		case *expr.Lookup:
			out = append(out, e.SetName)
		case *expr.Dynset:
			out = append(out, e.SetName)
		}
	}
	return out
}

// readsAny says whether a rule of ch reads one of names.
func readsAny(ch *Chain, names map[string]string) bool {
	for _, rl := range ch.Rules {
		for _, s := range setsRead(rl) {
			if _, ok := names[s]; ok {
				return true
			}
		}
	}
	return false
}

// renamed is exprs with every set of names read under its kernel name;
// exprs itself when none is (the model's expressions are shared, never
// changed).
func renamed(exprs []expr.Any, names map[string]string) []expr.Any {
	if len(names) == 0 {
		return exprs
	}
	out, copied := exprs, false
	for i, e := range exprs {
		var c expr.Any
		switch e := e.(type) {
		case *expr.Lookup:
			if k, ok := names[e.SetName]; ok {
				l := *e
				l.SetName, c = k, &l
			}
		case *expr.Dynset:
			if k, ok := names[e.SetName]; ok {
				d := *e
				d.SetName, c = k, &d
			}
		}
		if c != nil {
			if !copied {
				out, copied = slices.Clone(exprs), true
			}
			out[i] = c
		}
	}
	return out
}
