package policy

import (
	"encoding/binary"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"weak"
)

// Pods of one ReplicaSet, DaemonSet or Job carry equal labels and equal
// named ports; at 150,000 pods a map of three labels per pod was a sixth of
// the node role's heap. A pod's record holds the value it shares, which
// keeps it alive; the tables below only find it.

// shared is a value records share. It is never changed once made.
type shared[T any] struct{ v T }

// shareTable finds the shared value of a key while a record holds it.
type shareTable[T any] struct {
	mu    sync.Mutex
	byKey map[string]weak.Pointer[shared[T]]
}

var (
	labelSets = &shareTable[map[string]string]{byKey: map[string]weak.Pointer[shared[map[string]string]]{}}
	portLists = &shareTable[[]NamedPort]{byKey: map[string]weak.Pointer[shared[[]NamedPort]]{}}
)

// get returns the shared value of key, making it with own when there is
// none: own must return a value of the table's own, not the caller's.
func (t *shareTable[T]) get(key string, own func() T) *shared[T] {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s := t.byKey[key].Value(); s != nil {
		return s
	}
	s := &shared[T]{v: own()}
	t.byKey[key] = weak.Make(s)
	runtime.AddCleanup(s, t.forget, key)
	return s
}

// forget drops a value no record holds any more, unless the key has been
// given a new value since.
func (t *shareTable[T]) forget(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byKey[key].Value() == nil {
		delete(t.byKey, key)
	}
}

// shareLabels returns the shared set equal to l; nil for no labels.
func shareLabels(l map[string]string) *shared[map[string]string] {
	if len(l) == 0 {
		return nil
	}
	// A copy: the caller's map is an API object's, not the table's.
	return labelSets.get(labelsKey(l), func() map[string]string { return maps.Clone(l) })
}

// sharePorts returns the shared list equal to ps; nil for none.
func sharePorts(ps []NamedPort) *shared[[]NamedPort] {
	if len(ps) == 0 {
		return nil
	}
	return portLists.get(portsKey(ps), func() []NamedPort {
		own := slices.Clone(ps)
		for i := range own {
			own[i].Name = strings.Clone(own[i].Name) // not the decoded object's
		}
		return own
	})
}

// portsKey is ps written out in order: name, NUL (no port name holds
// one), protocol, port.
func portsKey(ps []NamedPort) string {
	var b []byte
	for _, p := range ps {
		b = append(append(b, p.Name...), 0, p.Protocol)
		b = binary.BigEndian.AppendUint16(b, p.Port)
	}
	return string(b)
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
