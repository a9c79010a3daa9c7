package policy

import (
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"weak"
)

// labelSet is one set of labels that pods share: the pods of one
// ReplicaSet, DaemonSet or Job carry equal labels, and at 150,000 pods a map
// of three labels per pod was a sixth of the node role's heap. A pod's
// record holds the set it shares, which keeps it alive; the table below
// only finds it.
type labelSet struct{ m map[string]string }

var labelSets = struct {
	sync.Mutex
	byKey map[string]weak.Pointer[labelSet]
}{byKey: map[string]weak.Pointer[labelSet]{}}

// shareLabels returns the shared set equal to l, making a copy of l the
// shared one when there is none: the records of pods with equal labels
// then hold one map. The maps are never changed once made.
func shareLabels(l map[string]string) *labelSet {
	if len(l) == 0 {
		return nil
	}
	key := labelsKey(l)
	labelSets.Lock()
	defer labelSets.Unlock()
	if s := labelSets.byKey[key].Value(); s != nil {
		return s
	}
	// A copy: the caller's map is an API object's, not this table's.
	s := &labelSet{m: maps.Clone(l)}
	labelSets.byKey[key] = weak.Make(s)
	runtime.AddCleanup(s, forgetLabels, key)
	return s
}

// forgetLabels drops a set no record holds any more, unless the key has
// been given a new set since.
func forgetLabels(key string) {
	labelSets.Lock()
	defer labelSets.Unlock()
	if labelSets.byKey[key].Value() == nil {
		delete(labelSets.byKey, key)
	}
}

// labelsKey is l written out in key order, with separators no label key
// or value contains.
func labelsKey(l map[string]string) string {
	keys := make([]string, 0, len(l))
	n := 0
	for k, v := range l {
		keys = append(keys, k)
		n += len(k) + len(v) + 2
	}
	slices.Sort(keys)
	var b strings.Builder
	b.Grow(n)
	for _, k := range keys {
		b.WriteString(k)
		b.WriteByte(0)
		b.WriteString(l[k])
		b.WriteByte(1)
	}
	return b.String()
}
