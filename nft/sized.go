package nft

import (
	"fmt"
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
// replaced by one of a fitting size under another name (otherName),
// made before the old one is broken: created and filled, then every chain
// reading it rewritten to read the new one, then the old one deleted.
// Dynamic sets stay resizable: the fixed table has no timeouts.

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

// kernelNames are the names a desired set may have in the kernel: its own
// and two others, so that a replacement always finds a free one even when
// an earlier one was cut short (both names read back). So no desired set's
// name may end in one of the suffixes (checkSetName).
func kernelNames(name string) [3]string { return [3]string{name, name + "-b", name + "-c"} }

// otherName is a name for a set replacing the desired set name that none
// of used has; false if all have.
func otherName(name string, used []string) (string, bool) {
	for _, n := range kernelNames(name) {
		if !slices.Contains(used, n) {
			return n, true
		}
	}
	return "", false
}

// checkSetName refuses a desired set's name that reads as another's
// kernel name.
func checkSetName(name string) error {
	if logicalName(name) != name {
		return fmt.Errorf("set %s: a set's name must not end in -b or -c (the names its replacements take)", name)
	}
	return nil
}

// logicalName is the desired set a kernel set stands for.
func logicalName(kernel string) string {
	for _, suffix := range []string{"-b", "-c"} {
		if n, ok := strings.CutSuffix(kernel, suffix); ok {
			return n
		}
	}
	return kernel
}

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
