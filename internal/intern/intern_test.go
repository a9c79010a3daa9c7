package intern

import (
	"runtime"
	"strings"
	"testing"
	"unsafe"
)

// TestEqualStringsShareOneCopyAcrossCollections: two equal strings made
// apart, with a collection between them, come back as one copy.
func TestEqualStringsShareOneCopyAcrossCollections(t *testing.T) {
	for _, s := range []string{"kube-system", "node-1", ""} {
		a := String(strings.Clone(s))
		runtime.GC()
		b := String(strings.Clone(s))
		if a != s || b != s {
			t.Fatalf("String(%q) = %q, %q", s, a, b)
		}
		if len(s) > 0 && unsafe.StringData(a) != unsafe.StringData(b) {
			t.Errorf("%q: two copies after a collection", s)
		}
	}
}
