// Package intern keeps one shared copy of strings that repeat across
// thousands of records: namespace, node and zone names.
package intern

import (
	"strings"
	"sync"
)

// String returns one shared copy of s. The table keeps every string it
// was given, a few per node, zone and namespace of the cluster;
// unique.Make alone would not do, as its copy is dropped once no handle
// to it is left, and the next record then gets a copy of its own.
func String(s string) string {
	mu.Lock()
	defer mu.Unlock()
	if v, ok := table[s]; ok {
		return v
	}
	s = strings.Clone(s)
	table[s] = s
	return s
}

var (
	mu    sync.Mutex
	table = map[string]string{}
)

// Bytes is String for a name still in a buffer being decoded: a name seen
// before costs no allocation (the map lookup does not copy b).
func Bytes(b []byte) string {
	mu.Lock()
	defer mu.Unlock()
	if v, ok := table[string(b)]; ok {
		return v
	}
	s := string(b)
	table[s] = s
	return s
}
